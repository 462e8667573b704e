"""The cost formula, exactly as specified, and the rule for nodes never measured."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate.core import ColdPenalty, NodeProfile, NodeState, RouteWeights, stage_cost
from hecate.core.cost import hop_cost, token_cost
from tests.support.builders import measured, pipeline, plan

latencies = st.floats(min_value=0, max_value=10_000, allow_nan=False)
loads = st.floats(min_value=0, max_value=1, allow_nan=False)
scores = st.floats(min_value=0.001, max_value=1_000, allow_nan=False)


def test_stage_cost_is_latency_plus_load_plus_inverse_score() -> None:
    node = NodeState(latency_ms=12.0, load=0.25, score=2.0)
    assert stage_cost(node) == pytest.approx(12.0 + 0.25 * 120 + 100 / 2.0)


def test_each_weight_scales_its_own_term() -> None:
    node = NodeState(latency_ms=12.0, load=0.25, score=2.0)
    w = RouteWeights(w_l=2.0, w_c=0.5, w_k=3.0)
    assert stage_cost(node, weights=w) == pytest.approx(2 * 12.0 + 0.5 * 30.0 + 3 * 50.0)


def test_score_is_floored_at_one_hundredth() -> None:
    assert stage_cost(NodeState(latency_ms=0, load=0, score=0.0)) == pytest.approx(100 / 0.01)


def test_all_weights_default_to_one() -> None:
    w = RouteWeights()
    assert (w.w_l, w.w_c, w.w_k, w.w_h, w.w_p) == (1.0, 1.0, 1.0, 1.0, 1.0)


def test_pipeline_cost_adds_fifteen_per_hop_and_ten_per_thousand_tokens() -> None:
    p = plan([pipeline("m-r0", "m", ("a", 0, 2), ("b", 2, 4), ("c", 4, 6))])
    state = measured(p, dict.fromkeys("abc", (10.0, 0.5, 4.0)))
    per_stage = 10.0 + 0.5 * 120 + 100 / 4.0
    assert state.pipeline_cost(p.pipelines[0]) == pytest.approx(3 * per_stage + 15 * 2)
    assert hop_cost(3) == 30.0
    assert token_cost(2048) == pytest.approx(20.0)


def test_in_flight_work_counts_as_load() -> None:
    idle = stage_cost(NodeState(latency_ms=5, load=0.2, score=1))
    busy = stage_cost(NodeState(latency_ms=5, load=0.2, score=1, in_flight=3))
    assert busy - idle == pytest.approx(3 * 0.1 * 120)


def test_an_unmeasured_node_is_penalised_not_ignored() -> None:
    profile = NodeProfile(node_id="a", capacity_layers=4, latency_ms=5.0, score=2.0)
    cold = stage_cost(NodeState(), profile)
    nominal = stage_cost(NodeState(latency_ms=5.0, load=0.0, score=2.0), profile)
    assert cold > nominal
    assert cold < float("inf")


@given(
    latency=latencies,
    score=scores,
    load=loads,
    measured_fields=st.sets(st.sampled_from(["latency", "load", "score"])),
    w=st.tuples(*[st.floats(min_value=0, max_value=10, allow_nan=False)] * 3),
)
def test_unmeasured_never_looks_cheaper_than_the_same_node_measured_at_nominal(
    latency: float,
    score: float,
    load: float,
    measured_fields: set[str],
    w: tuple[float, float, float],
) -> None:
    """Whatever subset of fields is missing, and whatever the weights, a node missing
    measurements costs at least what it would if measured at its declared values (and
    any load in range)."""
    weights = RouteWeights(w_l=w[0], w_c=w[1], w_k=w[2])
    profile = NodeProfile(node_id="a", capacity_layers=4, latency_ms=latency, score=score)
    nominal = NodeState(latency_ms=latency, load=load, score=score)
    partial = NodeState(
        latency_ms=latency if "latency" in measured_fields else None,
        load=load if "load" in measured_fields else None,
        score=score if "score" in measured_fields else None,
    )
    assert stage_cost(partial, profile, weights) >= stage_cost(nominal, profile, weights) - 1e-9


@given(
    nodes=st.lists(st.tuples(latencies, scores, loads), min_size=1, max_size=6),
    cold=st.data(),
)
def test_an_unmeasured_node_never_makes_its_pipeline_cheaper(
    nodes: list[tuple[float, float, float]], cold: st.DataObject
) -> None:
    names = [f"n{i}" for i in range(len(nodes))]
    stages = [(n, i, i + 1) for i, n in enumerate(names)]
    base = plan([pipeline("m-r0", "m", *stages)])
    profiles = tuple(
        NodeProfile(node_id=n, capacity_layers=4, latency_ms=lat, score=sc)
        for n, (lat, sc, _) in zip(names, nodes, strict=True)
    )
    p = type(base)(epoch=1, models=base.models, nodes=profiles, pipelines=base.pipelines)
    at_nominal = measured(
        p, {n: (lat, ld, sc) for n, (lat, sc, ld) in zip(names, nodes, strict=True)}
    )
    unknown = cold.draw(st.sets(st.sampled_from(names), min_size=1))
    state = at_nominal
    for n in unknown:
        state = state.with_node(n, NodeState())
    assert state.pipeline_cost(p.pipelines[0]) >= at_nominal.pipeline_cost(p.pipelines[0]) - 1e-6


def test_the_cold_penalty_is_configurable() -> None:
    harsh = ColdPenalty(latency_ms=1000.0, load=1.0, score=0.1)
    assert stage_cost(NodeState(), None, penalty=harsh) == pytest.approx(1000 + 120 + 1000)
