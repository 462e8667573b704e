"""A swarm that carries on from a published plan (another planner's) keeps what serves and
changes it only through growth and retirement."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate.core import PLANNERS, NodeProfile, Swarm, SwarmConfig

CONFIG = SwarmConfig(layers=12, pipelines=2, model_id="ncm-base")
NODES = [
    NodeProfile(node_id="gpu", capacity_layers=12, latency_ms=3.5, score=4.0),
    NodeProfile(node_id="laptop", capacity_layers=8, latency_ms=12.0, score=1.5),
    NodeProfile(node_id="desktop", capacity_layers=6, latency_ms=8.0, score=2.0),
    NodeProfile(node_id="pi", capacity_layers=4, latency_ms=40.0, score=0.5),
]


@pytest.mark.parametrize("theirs", sorted(PLANNERS))
@pytest.mark.parametrize("mine", sorted(PLANNERS))
def test_resuming_keeps_the_published_plan_whatever_the_strategy(theirs: str, mine: str) -> None:
    published = Swarm(NODES, CONFIG, planner=theirs).plan
    resumed = Swarm.resume(published, CONFIG, planner=mine)
    assert resumed.plan == published
    assert resumed.planner.name == mine
    assert resumed.status() == "healthy"


@given(st.sampled_from(sorted(PLANNERS)), st.sampled_from(sorted(PLANNERS)))
def test_a_resumed_swarm_grows_and_retires_without_reshuffling(theirs: str, mine: str) -> None:
    published = Swarm(NODES, CONFIG, planner=theirs).plan
    swarm = Swarm.resume(published, CONFIG, planner=mine)
    swarm.add_node(NodeProfile(node_id="newcomer", capacity_layers=6, latency_ms=6.0))
    assert set(published.pipelines) <= set(swarm.plan.pipelines)  # nothing reshuffled
    assert not swarm.plan.validate()
    swarm.remove_node("pi")
    assert "pi" not in {n.node_id for n in swarm.plan.nodes}
    assert all("pi" not in p.node_ids for p in swarm.plan.pipelines)
    assert not swarm.plan.validate()
