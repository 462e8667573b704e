"""Small builders for hand-written plans and states in unit tests."""

from __future__ import annotations

from collections.abc import Sequence

from hecate.core import ModelSpec, NodeProfile, Pipeline, Sample, Stage, SwarmPlan, SwarmState

StageSpec = tuple[str, int, int]


def pipeline(pipeline_id: str, model_id: str, *stages: StageSpec) -> Pipeline:
    return Pipeline(
        pipeline_id=pipeline_id,
        model_id=model_id,
        stages=tuple(Stage(node_id=n, layer_start=a, layer_end=b) for n, a, b in stages),
    )


def plan(
    pipelines: Sequence[Pipeline],
    *,
    models: Sequence[ModelSpec] | None = None,
    capacity: int = 64,
    latency_ms: float = 10.0,
    score: float = 1.0,
) -> SwarmPlan:
    """A plan whose members are every node its pipelines name (plus none)."""
    if models is None:
        layers: dict[str, int] = {}
        for p in pipelines:
            layers[p.model_id] = max(layers.get(p.model_id, 0), p.stages[-1].layer_end)
        models = [ModelSpec(model_id=m, layers=n) for m, n in layers.items()]
    names = sorted({s.node_id for p in pipelines for s in p.stages})
    nodes = tuple(
        NodeProfile(node_id=n, capacity_layers=capacity, latency_ms=latency_ms, score=score)
        for n in names
    )
    return SwarmPlan(epoch=1, models=tuple(models), nodes=nodes, pipelines=tuple(pipelines))


def measured(
    p: SwarmPlan, values: dict[str, tuple[float, float, float]] | None = None, now: float = 0.0
) -> SwarmState:
    """A state where every node was measured once: ``(latency_ms, load, score)``."""
    state = SwarmState.from_plan(p)
    for n in p.nodes:
        lat, load, score = (values or {}).get(n.node_id, (10.0, 0.0, 1.0))
        state = state.observe(
            n.node_id, Sample(latency_ms=lat, load=load, score=score), now=now, alpha=1.0
        )
    return state
