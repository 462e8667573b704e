"""Planner strategies by name, including ones a third-party package installs."""

from __future__ import annotations

from pathlib import Path

import pytest

from hecate.core import ModelSpec, NodeProfile, UnknownPlanner
from hecate_planner import strategies

PLUGIN = '''
from hecate.core import GreedyPlanner


class ReversePlanner(GreedyPlanner):
    """Greedy, but over the nodes in reverse id order (a stand-in for any strategy)."""

    name = "reverse"


NOT_A_PLANNER = object()
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed distribution declaring entry points in the ``hecate.planners`` group."""
    (tmp_path / "hecate_test_plugin.py").write_text(PLUGIN)
    dist = tmp_path / "hecate_test_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: hecate-test-plugin\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(
        "[hecate.planners]\nreverse = hecate_test_plugin:ReversePlanner\n"
        "broken = hecate_test_plugin:NOT_A_PLANNER\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))


def test_built_in_strategies_are_available_by_name() -> None:
    assert {"greedy", "proportional"} <= set(strategies.available())
    assert strategies.load("proportional").name == "proportional"


@pytest.mark.usefixtures("plugin")
def test_a_strategy_from_another_package_is_found_through_its_entry_point() -> None:
    assert strategies.available()["reverse"] == "hecate_test_plugin:ReversePlanner"
    planner = strategies.load("reverse")
    plan = planner.plan(
        [ModelSpec(model_id="m", layers=4)], [NodeProfile(node_id="a", capacity_layers=4)]
    )
    assert plan.validate() == []


@pytest.mark.usefixtures("plugin")
def test_an_entry_point_that_is_not_a_planner_is_refused_clearly() -> None:
    with pytest.raises(UnknownPlanner, match="is not a Planner"):
        strategies.load("broken")


def test_an_unknown_strategy_lists_the_known_ones() -> None:
    with pytest.raises(UnknownPlanner, match=r"known planners: .*greedy"):
        strategies.load("nope")
