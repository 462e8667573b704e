"""The planner's view of its members (hecate_planner.membership): pure, the clock
handed in, each method saying whether the plan changed."""

from __future__ import annotations

import logging

from hecate.core import NodeProfile, SwarmConfig, get_planner
from hecate.wire.messages import NodeEvent
from hecate_planner.membership import Membership

LOG = logging.getLogger("test.membership")
WAIT = 5.0


def _node(i: int, layers: int = 6) -> NodeProfile:
    return NodeProfile(node_id=f"n{i}", capacity_layers=layers)


def _news(node: str, state: str, at: float, reason: str = "silent") -> NodeEvent:
    return NodeEvent(node_id=node, state=state, reason=reason, at=at)  # type: ignore[arg-type]


def _formed(count: int, pipelines: int = 2) -> Membership:
    view = Membership(SwarmConfig(12, pipelines), get_planner("greedy"), LOG)
    for i in range(count):
        assert view.admit(_node(i), now=0.0)
    view.form()
    return view


def _planned(view: Membership) -> set[str]:
    assert view.swarm is not None
    return {n for p in view.swarm.plan.pipelines for n in p.node_ids}


def test_a_rejoin_changes_nothing_and_a_changed_profile_is_admitted_again() -> None:
    view = _formed(4)
    assert not view.admit(_node(1), now=1.0)
    assert view.admit(_node(1, layers=12), now=2.0)
    assert view.members["n1"].capacity_layers == 12
    assert view.last_join == 2.0


def test_a_member_down_leaves_the_plan_only_after_the_wait_with_those_down_beside_it() -> None:
    view = _formed(6)  # two copies of 12 layers over 6-layer nodes, two spare
    first, second = sorted(_planned(view))[:2]
    view.down(_news(first, "down", at=10.0), now=100.0)
    view.down(_news(second, "down", at=11.0), now=102.0)
    assert not view.retire_due(now=104.9, wait_s=WAIT)
    assert first in _planned(view)
    # The first is due; the second, down 3 s (over half the wait), goes with it.
    assert view.retire_due(now=105.0, wait_s=WAIT)
    assert first not in view.members
    assert second not in view.members
    assert not {first, second} & _planned(view)


def test_an_older_word_is_left_out_and_a_retired_member_heard_again_comes_back() -> None:
    view = _formed(6)
    node = sorted(_planned(view))[0]
    view.down(_news(node, "down", at=10.0), now=100.0)
    assert not view.up(_news(node, "up", at=9.0), now=100.5)  # older than the down
    assert node in view.silent
    assert view.retire_due(now=106.0, wait_s=WAIT)
    assert node not in view.members
    assert view.up(_news(node, "up", at=20.0), now=110.0)
    assert node in view.members
    assert node not in view.silent


def test_the_last_copy_of_a_model_is_kept_through_a_member_down() -> None:
    view = _formed(2, pipelines=1)  # one copy over both nodes, no spare
    node = sorted(_planned(view))[0]
    view.down(_news(node, "down", at=1.0), now=0.0)
    assert view.retirable(node) is False
    assert not view.retire_due(now=60.0, wait_s=WAIT)
    assert node in view.members
    assert node in _planned(view)


def test_a_leaver_out_of_the_plan_changes_it_and_an_unknown_one_does_not() -> None:
    view = _formed(6)
    node = sorted(_planned(view))[0]
    assert view.leave(node)
    assert node in view.gone
    assert node not in _planned(view)
    assert not view.leave("stranger")


def test_resuming_another_planners_plan_applies_what_this_one_heard() -> None:
    theirs = _formed(5)
    assert theirs.swarm is not None
    mine = Membership(SwarmConfig(12, 2), get_planner("greedy"), LOG)
    for i in (0, 1, 2, 3, 5):  # n4 left while we listened; n5 joined only here
        mine.admit(_node(i), now=0.0)
    mine.gone.add("n4")
    mine.resume(theirs.swarm.plan)
    assert mine.swarm is not None
    planned = {n.node_id for n in mine.swarm.plan.nodes}
    assert "n4" not in planned
    assert "n5" in planned


def test_profile_changes_are_planned_at_most_once_a_pace_the_latest_winning() -> None:
    view = _formed(4)
    view.profile_pace_s = 30.0
    assert view.admit(_node(1, layers=12), now=1.0)  # the first change: planned at once
    epochs = 1
    for i in range(40):  # a node re-joining with a new profile, again and again
        epochs += view.admit(_node(1, layers=7 + i % 5), now=2.0 + i * 0.1)
        epochs += view.changes_due(now=2.0 + i * 0.1)
    assert epochs == 1
    assert view.members["n1"].capacity_layers == 12  # still the planned one
    assert view.pending["n1"].capacity_layers == 7 + 39 % 5  # the latest held
    assert not view.changes_due(now=30.9)
    assert view.changes_due(now=31.0)
    assert view.members["n1"].capacity_layers == 7 + 39 % 5
    assert not view.pending


def test_a_held_change_undone_by_a_rejoin_with_the_planned_profile_is_dropped() -> None:
    view = _formed(4)
    view.profile_pace_s = 30.0
    assert view.admit(_node(1, layers=12), now=1.0)
    assert not view.admit(_node(1, layers=8), now=2.0)
    assert not view.admit(_node(1, layers=12), now=3.0)  # back to what the plan has
    assert not view.pending
    assert not view.changes_due(now=100.0)
