"""The model declares what executes it: its layers go only to nodes running that
executor, under both strategies, through growth and retirement; a model no node runs is
not planned; a topology that asks for one is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hecate.core import (
    PLANNERS,
    InsufficientCapacity,
    ModelSpec,
    NodeProfile,
    Swarm,
    SwarmConfig,
    SwarmPlan,
)
from hecate.core.plan import Pipeline, Stage, executes
from hecate.core.planners import get_planner, unexecutable
from hecate.sim.topology import TopologyError, parse_topology

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
EXECUTORS = ("toy", "null", "smollm2", "upstream")


def assert_executed(plan: SwarmPlan) -> None:
    """Every stage of every pipeline is on a node that runs its model's executor."""
    executor = {n.node_id: n.executor for n in plan.nodes}
    for p in plan.pipelines:
        spec = plan.model(p.model_id)
        assert spec is not None
        for s in p.stages:
            assert executes(executor[s.node_id], spec), (p.pipeline_id, s.node_id)
    assert plan.validate() == []


@st.composite
def swarms(draw: st.DrawFn) -> tuple[list[ModelSpec], list[NodeProfile]]:
    roles = ["base", *draw(st.lists(st.sampled_from(["expert", "reserve"]), max_size=3))]
    models = [
        ModelSpec(
            model_id=f"m{i}",
            layers=draw(st.integers(1, 12)),
            role=role,  # type: ignore[arg-type]
            replicas=draw(st.integers(0, 3)),
            executor=draw(st.sampled_from(EXECUTORS)),
        )
        for i, role in enumerate(roles)
    ]
    nodes = [
        NodeProfile(
            node_id=f"n{i}",
            capacity_layers=draw(st.integers(0, 12)),
            latency_ms=draw(st.floats(0, 20)),
            executor=draw(st.sampled_from(EXECUTORS)),
        )
        for i in range(draw(st.integers(1, 8)))
    ]
    return models, nodes


@settings(max_examples=200, deadline=None)
@given(swarm=swarms(), strategy=st.sampled_from(sorted(PLANNERS)))
def test_no_plan_puts_a_model_on_a_node_with_another_executor(
    swarm: tuple[list[ModelSpec], list[NodeProfile]], strategy: str
) -> None:
    models, nodes = swarm
    plan = get_planner(strategy).plan(models, nodes)
    assert_executed(plan)
    for model, _present in unexecutable(models, nodes):
        assert plan.pipelines_of(model.model_id) == ()


@settings(max_examples=100, deadline=None)
@given(
    swarm=swarms(),
    joins=st.lists(
        st.tuples(st.integers(0, 12), st.sampled_from(EXECUTORS)), min_size=1, max_size=4
    ),
    leaves=st.lists(st.integers(0, 20), max_size=3),
    strategy=st.sampled_from(sorted(PLANNERS)),
)
def test_growth_and_retirement_keep_every_model_on_its_executor(
    swarm: tuple[list[ModelSpec], list[NodeProfile]],
    joins: list[tuple[int, str]],
    leaves: list[int],
    strategy: str,
) -> None:
    models, nodes = swarm
    base = models[0]
    # A swarm starts only once its base is served: give it one node that runs it.
    nodes.append(NodeProfile(node_id="seed", capacity_layers=base.layers, executor=base.executor))
    config = SwarmConfig(
        base.layers,
        max(1, base.replicas),
        model_id=base.model_id,
        models=tuple(models[1:]),
        executor=base.executor,
    )
    s = Swarm(nodes, config, planner=strategy)
    assert_executed(s.plan)
    for i, (capacity, executor) in enumerate(joins):
        s.add_node(NodeProfile(node_id=f"j{i}", capacity_layers=capacity, executor=executor))
        assert_executed(s.plan)
    for pick in leaves:
        members = sorted(n.node_id for n in s.plan.nodes)
        if len(members) > 1:
            s.remove_node(members[pick % len(members)])
            assert_executed(s.plan)


def test_a_real_model_among_toy_nodes_is_not_planned_and_says_what_is_missing() -> None:
    real = ModelSpec(model_id="smollm2-135m", layers=30, executor="smollm2")
    toy_nodes = [NodeProfile(node_id=n, capacity_layers=30) for n in ("a", "b")]
    plan = get_planner("greedy").plan([real], toy_nodes)
    assert plan.pipelines == ()
    assert unexecutable([real], toy_nodes) == [(real, ("toy",))]
    with pytest.raises(InsufficientCapacity) as err:
        Swarm(toy_nodes, SwarmConfig(30, 1, model_id="smollm2-135m", executor="smollm2"))
    assert "'smollm2'" in err.value.message
    assert "0 nodes" in err.value.message


def test_a_node_executes_only_models_declared_for_its_executor() -> None:
    assert executes("null", ModelSpec(model_id="m", layers=1, executor="null"))
    assert not executes("null", ModelSpec(model_id="m", layers=1))
    assert not executes("null", ModelSpec(model_id="m", layers=1, executor="smollm2"))
    assert not executes("toy", ModelSpec(model_id="m", layers=1, executor="null"))
    assert not executes("smollm2", ModelSpec(model_id="m", layers=1))


def test_a_plan_giving_a_model_to_another_executor_is_invalid() -> None:
    plan = SwarmPlan(
        epoch=1,
        models=(ModelSpec(model_id="real", layers=4, executor="smollm2"),),
        nodes=(NodeProfile(node_id="a", capacity_layers=4),),
        pipelines=(
            Pipeline(
                pipeline_id="real-r0",
                model_id="real",
                stages=(Stage(node_id="a", layer_start=0, layer_end=4),),
            ),
        ),
    )
    problems = plan.validate()
    assert [p.code for p in problems] == ["wrong_executor"]
    assert "'smollm2'" in problems[0].message
    assert "'toy'" in problems[0].message


# -- the topology file ---------------------------------------------------------------


def topology(
    models: list[dict[str, object]], nodes: list[dict[str, object]], **rest: object
) -> bytes:
    return json.dumps({"models": models, "nodes": nodes, **rest}).encode()


def test_a_topology_whose_model_no_node_runs_is_refused_naming_model_executor_and_nodes() -> None:
    data = topology(
        [{"id": "smollm2-135m", "layers": 30, "executor": "smollm2"}],
        [{"id": "a", "capacity_layers": 30}, {"id": "b", "capacity_layers": 30}],
    )
    with pytest.raises(TopologyError) as err:
        parse_topology(data)
    message = err.value.message
    assert err.value.code == "bad_topology"
    assert "'smollm2-135m'" in message
    assert "'smollm2'" in message
    assert "a (toy)" in message
    assert "b (toy)" in message


def test_the_forgotten_executor_on_the_model_is_refused_too() -> None:
    # The original mistake the other way round: real nodes, a model left at the default.
    data = topology(
        [{"id": "smollm2-135m", "layers": 30}],
        [{"id": "a", "capacity_layers": 30, "executor": "smollm2"}],
    )
    with pytest.raises(TopologyError, match="needs executor 'toy'"):
        parse_topology(data)


def test_a_growth_node_counts_for_the_file_but_not_for_the_nodes_started() -> None:
    data = topology(
        [
            {"id": "base", "layers": 4},
            {"id": "real", "layers": 4, "role": "expert", "executor": "smollm2"},
        ],
        [{"id": "a", "capacity_layers": 4}],
        growth=[{"id": "late", "capacity_layers": 4, "executor": "smollm2"}],
    )
    topo = parse_topology(data)
    with pytest.raises(TopologyError, match="'real' needs executor 'smollm2'"):
        topo.require_executors(topo.nodes)


def test_every_example_parses_and_the_smollm2_one_declares_its_executor() -> None:
    for path in sorted(EXAMPLES.glob("*.json")):
        parse_topology(path.read_bytes())
    topo = parse_topology((EXAMPLES / "smollm2.json").read_bytes())
    config = topo.swarm_config(2)
    assert config.all_models()[0].executor == "smollm2"
    assert {n.profile().executor for n in topo.nodes} == {"smollm2"}
    assert {m.executor for m in topo.model_specs(2)} == {"smollm2"}
