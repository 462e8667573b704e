"""The swarm page's state, computed from a plan, telemetry and circuits with no I/O:
live replicas per layer, complete and servable pipelines, the models /v1/models lists,
the bounded event feed, the counters behind /metrics and the tokens/s window."""

from __future__ import annotations

import itertools
from typing import get_args

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from hecate.core import ModelSpec, Pipeline, Stage, SwarmPlan
from hecate_gateway.swarmfeed import Feed, Tally, TokenRate
from hecate_gateway.swarmreport import Circuit, NodeSeen, live_replicas, report
from tests.support.builders import pipeline, plan

UP = NodeSeen(alive=True, last_seen=1.0)
DOWN = NodeSeen(alive=False, last_seen=1.0)
DRAINING = NodeSeen(alive=True, draining=True, last_seen=1.0)

TWO = plan(
    [
        pipeline("m-r0", "m", ("a", 0, 2), ("b", 2, 4)),
        pipeline("m-r1", "m", ("c", 0, 3), ("d", 3, 4)),
    ]
)


def test_a_killed_node_breaks_its_pipeline_and_thins_its_layers() -> None:
    r = report(TWO, 7, {"a": UP, "b": DOWN, "c": UP, "d": UP}, {})
    (m,) = r.models
    assert [(p.pipeline_id, p.complete, p.servable) for p in m.pipelines] == [
        ("m-r0", False, False),
        ("m-r1", True, True),
    ]
    assert m.live_replicas == (2, 2, 1, 1)  # b held layers 2-3
    assert m.min_live_replicas == 1
    assert (m.complete_pipelines, m.servable_pipelines) == (1, 1)
    assert (r.nodes_up, r.nodes_down, r.epoch) == (3, 1, 7)
    assert r.servable_models() == ["m"]


def test_draining_or_a_circuit_not_closed_keeps_a_pipeline_complete_but_unservable() -> None:
    r = report(TWO, 1, {"a": DRAINING, "b": UP, "c": UP, "d": UP}, {"d": "half_open"})
    (m,) = r.models
    assert [(p.complete, p.servable) for p in m.pipelines] == [(True, False), (True, False)]
    assert not m.servable
    assert r.servable_models() == []
    a, _b, _c, d = r.nodes
    assert (a.health, a.serving) == ("draining", False)
    assert (d.health, d.circuit, d.serving) == ("up", "half_open", False)
    assert m.live_replicas == (1, 1, 2, 2)  # a is leaving: not a replica to count on


def test_a_node_telemetry_never_heard_is_down() -> None:
    r = report(TWO, 1, {}, {})
    assert {n.health for n in r.nodes} == {"down"}
    assert r.models[0].min_live_replicas == 0


def test_a_model_is_servable_through_a_reserve_that_serves() -> None:
    p = plan(
        [
            pipeline("big-r0", "big", ("a", 0, 4)),
            pipeline("small-r0", "small", ("b", 0, 2)),
            pipeline("side-r0", "side", ("c", 0, 2)),
        ],
        models=[
            ModelSpec(model_id="big", layers=4),
            ModelSpec(model_id="small", layers=2, role="reserve"),
            ModelSpec(model_id="side", layers=2, role="expert"),
            ModelSpec(model_id="unplanned", layers=2, role="expert"),
        ],
    )
    r = report(p, 1, {"a": DOWN, "b": UP, "c": DOWN}, {})
    by = {m.model_id: m for m in r.models}
    assert (by["big"].servable, by["big"].via_reserve) == (True, "small")
    assert (by["side"].servable, by["side"].via_reserve) == (True, "small")
    assert (by["small"].servable, by["small"].via_reserve) == (True, None)
    assert not by["unplanned"].servable  # never planned: nothing to degrade from
    assert r.servable_models() == ["big", "small", "side"]

    r = report(p, 1, {"a": DOWN, "b": DOWN, "c": UP}, {})
    assert r.servable_models() == ["side"]


def test_no_plan_means_nothing_to_serve() -> None:
    r = report(None, 0, {"a": UP}, {})
    assert not r.has_plan
    assert r.models == ()
    assert r.servable_models() == []


# -- properties over random plans --------------------------------------------------------

NODES = ["n0", "n1", "n2", "n3", "n4", "n5"]
Case = tuple[SwarmPlan, dict[str, NodeSeen], dict[str, Circuit]]


@st.composite
def swarms(draw: st.DrawFn) -> Case:
    layers = draw(st.integers(1, 8))
    pipelines = []
    for i in range(draw(st.integers(0, 4))):
        cuts = sorted(draw(st.sets(st.integers(1, layers - 1), max_size=3))) if layers > 1 else []
        bounds = [0, *cuts, layers]
        stages = tuple(
            Stage(node_id=draw(st.sampled_from(NODES)), layer_start=a, layer_end=b)
            for a, b in itertools.pairwise(bounds)
        )
        pipelines.append(Pipeline(pipeline_id=f"p{i}", model_id="m", stages=stages))
    p = plan(pipelines, models=[ModelSpec(model_id="m", layers=layers)])
    seen = draw(
        st.dictionaries(
            st.sampled_from(NODES),
            st.builds(NodeSeen, alive=st.booleans(), draining=st.booleans()),
        )
    )
    circuits: dict[str, Circuit] = draw(
        st.dictionaries(st.sampled_from(NODES), st.sampled_from(get_args(Circuit)))
    )
    return p, seen, circuits


@given(swarms())
def test_min_live_replicas_is_the_fewest_live_nodes_covering_any_layer(
    case: Case,
) -> None:
    p, seen, circuits = case
    r = report(p, 1, seen, circuits)
    (m,) = r.models
    live = {n for n, s in seen.items() if s.alive and not s.draining}
    covering = [
        {
            s.node_id
            for q in p.pipelines
            for s in q.stages
            if s.layer_start <= layer < s.layer_end and s.node_id in live
        }
        for layer in range(m.layers)
    ]
    assert list(m.live_replicas) == [len(c) for c in covering]
    assert m.min_live_replicas == min(len(c) for c in covering)


@given(swarms())
def test_servable_pipelines_are_those_every_router_would_send_to(
    case: Case,
) -> None:
    p, seen, circuits = case
    r = report(p, 1, seen, circuits)
    (m,) = r.models

    def usable(n: str) -> bool:
        s = seen.get(n)
        return (
            s is not None and s.alive and not s.draining and circuits.get(n, "closed") == "closed"
        )

    def heard(n: str) -> bool:
        s = seen.get(n)
        return s is not None and s.alive

    for pr, q in zip(m.pipelines, p.pipelines, strict=True):
        assert pr.servable == all(usable(s.node_id) for s in q.stages)
        assert pr.complete == all(heard(s.node_id) for s in q.stages)
        assert not pr.servable or pr.complete
    assert m.servable == any(pr.servable for pr in m.pipelines)
    assert r.servable_models() == (["m"] if m.servable else [])
    assert r.nodes_up + r.nodes_down + r.nodes_draining == len(r.nodes)


def test_live_replicas_count_a_node_once_however_many_pipelines_it_is_in() -> None:
    p = plan(
        [
            pipeline("r0", "m", ("a", 0, 2)),
            pipeline("r1", "m", ("a", 0, 1), ("b", 1, 2)),
        ]
    )
    assert live_replicas(p, "m", 2, ["a", "b"]) == [1, 2]
    assert live_replicas(p, "m", 2, ["b"]) == [0, 1]


# -- the feed, counters and token rate -----------------------------------------------------


@given(st.integers(1, 30), st.lists(st.sampled_from(["a", "b", "c"]), max_size=120))
def test_the_feed_keeps_the_newest_events_within_its_bound(size: int, nodes: list[str]) -> None:
    feed = Feed(size=size, fold_s=0.0)
    for i, n in enumerate(nodes):
        feed.add("node", "down", f"{n} down", float(i) * 10, node_id=n)
    shown = feed.newest_first()
    assert len(shown) <= size
    assert [e.at for e in shown] == sorted((e.at for e in shown), reverse=True)
    folded = sum(e.count for e in shown)
    assert folded <= len(nodes)
    if nodes:
        assert shown[0].node_id == nodes[-1]


def test_a_burst_of_like_failovers_folds_into_one_line_and_since_reports_its_changes() -> None:
    feed = Feed(size=10, fold_s=5.0)
    first = feed.add("failover", "replica", "lost a", 100.0, node_id="a", model_id="m")
    mark = feed.rev
    for i in range(11):
        feed.add("failover", "replica", "lost a", 100.0 + i * 0.1, node_id="a", model_id="m")
    (line,) = feed.newest_first()
    assert (line.id, line.count) == (first.id, 12)
    assert feed.since(mark) == [line]
    other = feed.add("node", "down", "a down", 101.5, node_id="a")
    assert feed.since(line.rev) == [other]
    later = feed.add("failover", "replica", "lost a", 130.0, node_id="a", model_id="m")
    assert later.id != first.id  # a different line: the last one is not the newest
    assert later.count == 1


def test_tally_counts_failovers_by_kind_and_trips_only_from_closed() -> None:
    t = Tally()
    for kind in ["replica", "replica", "splice"]:
        t.failover(kind)
    assert dict(t.failovers) == {"replica": 2, "splice": 1}
    assert t.breaker("a", "open")  # first heard of as open: a trip
    assert not t.breaker("a", "half_open")
    assert not t.breaker("a", "open")  # the probe failed: re-opened, not tripped
    assert not t.breaker("a", "closed")
    assert t.breaker("a", "open")
    assert t.breaker_trips == 2


@given(st.dictionaries(st.integers(0, 100), st.integers(0, 50), max_size=60))
def test_tokens_per_second_is_what_the_window_saw(adds: dict[int, int]) -> None:
    rate = TokenRate(window_s=5.0)
    for t, n in sorted(adds.items()):  # whole seconds apart: each count has its own slot
        rate.add(n, float(t))
    now = max(adds, default=0) + 1.0
    expected = sum(n for t, n in adds.items() if t > now - 5.0)
    assert rate.rate(now) == expected / 5.0
    assert rate.rate(now + 10.0) == 0.0


def test_tokens_counted_one_by_one_share_slots_and_keep_their_sum() -> None:
    rate = TokenRate(window_s=2.0)
    for i in range(1000):
        rate.add(1, 10.0 + i * 0.001)
    assert rate.rate(11.5) == 500.0
    assert len(rate._counts) <= 11


def test_each_node_s_memory_in_use_rides_beside_its_limit() -> None:
    nodes = tuple(
        msgspec.structs.replace(n, memory_bytes=1536 << 20, memory_from="cgroup")
        if n.node_id == "a"
        else n
        for n in TWO.nodes
    )
    seen = {
        n: NodeSeen(alive=True, last_seen=1.0, memory_used=(852 << 20) * (n == "a")) for n in "abcd"
    }
    r = report(msgspec.structs.replace(TWO, nodes=nodes), 1, seen, {})
    a, b, *_ = r.nodes
    assert (a.memory_used, a.memory_bytes, a.memory_from) == (852 << 20, 1536 << 20, "cgroup")
    assert (b.memory_used, b.memory_bytes, b.memory_from) == (0, 0, "")
