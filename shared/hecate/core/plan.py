"""The plan: who should run which layers of which model.

A plan is expensive to compute and changes rarely (a new epoch per change); it is
plain data, frozen, and carries the membership it was made for so that it can be
validated on its own and shipped whole to another process.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Annotated, Literal

import msgspec

from hecate.core.kinds import ExecutorKind

# Ids travel as NATS subject tokens and KV keys: one slug rule for all of them.
SLUG_PATTERN = "^[a-z0-9][a-z0-9_-]{0,63}$"
Slug = Annotated[str, msgspec.Meta(pattern=SLUG_PATTERN)]

ModelRole = Literal["base", "expert", "reserve"]


#: Where a node's memory figure comes from: ``--memory``, its cgroup's limit, what the
#: machine had free as it started; empty when the node did not say (a toy executor).
MemorySource = Literal["flag", "cgroup", "free", ""]
#: The most memory a node may declare, or report in use: a petabyte.
MOST_MEMORY = 1 << 50


class NodeProfile(msgspec.Struct, frozen=True, kw_only=True):
    """What a node declares when it joins: how many layers it can hold, how fast it is,
    and the executor it computes them with (``hecate node --executor``).

    ``memory_bytes`` is the memory the node may use and ``memory_from`` where it read
    it; ``layer_bytes`` what one layer of its model costs it (weights as its engine
    holds them, and its KV budget): for such a node ``capacity_layers`` is what fits,
    unless the operator gave ``--capacity-layers``."""

    node_id: Slug
    # Bounded as they are decoded: a join is a node's own word, and the planner sums
    # these over the swarm.
    capacity_layers: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
    latency_ms: Annotated[float, msgspec.Meta(ge=0, le=3_600_000)] = 0.0
    score: Annotated[float, msgspec.Meta(gt=0, le=1_000_000)] = 1.0
    executor: Slug = "toy"
    kind: ExecutorKind = "layers"  # what that executor declares (its node fills it in)
    memory_bytes: Annotated[int, msgspec.Meta(ge=0, le=MOST_MEMORY)] = 0
    memory_from: MemorySource = ""
    layer_bytes: Annotated[int, msgspec.Meta(ge=0, le=MOST_MEMORY)] = 0


class ModelSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A model the swarm serves.

    ``base`` is the model the swarm exists for; ``expert`` models are grown onto spare
    capacity and never stand in for the base; a ``reserve`` model is the designated
    degraded fallback. ``replicas`` is how many complete pipelines the planner aims for;
    with ``auto``, the least it aims for: once every model has its ``replicas``, an auto
    model gets every further complete copy the capacity left can form, and what cannot
    complete one stays spare (for relocations when a node leaves, and for growth).
    ``executor`` is what computes the model: its layers go only to nodes that run it
    (:func:`executes`), so a node can never serve a real model with another network.
    """

    model_id: Slug
    layers: Annotated[int, msgspec.Meta(ge=1)]
    role: ModelRole = "base"
    replicas: Annotated[int, msgspec.Meta(ge=0)] = 1
    executor: Slug = "toy"
    auto: bool = False


def executes(executor: str, model: ModelSpec) -> bool:
    """Whether a node running ``executor`` may be given layers of ``model``."""
    return executor == model.executor


class Stage(msgspec.Struct, frozen=True, kw_only=True):
    """One hop of a pipeline: ``node_id`` runs layers ``[layer_start, layer_end)``."""

    node_id: str
    layer_start: int
    layer_end: int

    @property
    def size(self) -> int:
        return self.layer_end - self.layer_start


class Pipeline(msgspec.Struct, frozen=True, kw_only=True):
    """A chain of stages that covers every layer of one model exactly once."""

    pipeline_id: str
    model_id: str
    stages: tuple[Stage, ...]

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(s.node_id for s in self.stages)


class PlanProblem(msgspec.Struct, frozen=True, kw_only=True):
    """One thing wrong with a plan, with a stable code and an actionable message."""

    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class SwarmPlan(msgspec.Struct, frozen=True, kw_only=True):
    """Epoch-numbered assignment of layer ranges to nodes, for every model served."""

    epoch: int
    models: tuple[ModelSpec, ...]
    nodes: tuple[NodeProfile, ...]
    pipelines: tuple[Pipeline, ...]

    def model(self, model_id: str) -> ModelSpec | None:
        for m in self.models:
            if m.model_id == model_id:
                return m
        return None

    def executor_kind(self, model_id: str) -> ExecutorKind | None:
        """The kind the executor of ``model_id`` declares, as its nodes said when they
        joined; None when the plan holds no such model or no node running it."""
        m = self.model(model_id)
        if m is None:
            return None
        return next((n.kind for n in self.nodes if n.executor == m.executor), None)

    def pipelines_of(self, model_id: str) -> tuple[Pipeline, ...]:
        return tuple(p for p in self.pipelines if p.model_id == model_id)

    def spare_nodes(self) -> tuple[str, ...]:
        """The nodes of the plan that hold no layer of any pipeline: spare capacity."""
        used = {s.node_id for p in self.pipelines for s in p.stages}
        return tuple(n.node_id for n in self.nodes if n.node_id not in used)

    def layers_used(self) -> dict[str, int]:
        """Layers each node hosts across every pipeline of every model."""
        used: dict[str, int] = defaultdict(int)
        for p in self.pipelines:
            for s in p.stages:
                used[s.node_id] += s.size
        return dict(used)

    def validate(self) -> list[PlanProblem]:
        """Every problem with this plan; an empty list means the plan is valid."""
        problems: list[PlanProblem] = []
        problems += _duplicates("duplicate_model", (m.model_id for m in self.models))
        problems += _duplicates("duplicate_node", (n.node_id for n in self.nodes))
        problems += _duplicates("duplicate_pipeline", (p.pipeline_id for p in self.pipelines))
        models = {m.model_id: m for m in self.models}
        capacity = {n.node_id: n.capacity_layers for n in self.nodes}
        executor = {n.node_id: n.executor for n in self.nodes}
        for p in self.pipelines:
            model = models.get(p.model_id)
            if model is None:
                problems.append(
                    PlanProblem(
                        code="unknown_model",
                        message=f"pipeline {p.pipeline_id} serves unknown model {p.model_id!r}",
                    )
                )
                continue
            problems += _coverage(p, model.layers)
            for s in p.stages:
                if s.node_id not in capacity:
                    problems.append(
                        PlanProblem(
                            code="unknown_node",
                            message=f"pipeline {p.pipeline_id} uses node {s.node_id!r}, "
                            "which is not a member of the plan",
                        )
                    )
                elif not executes(executor[s.node_id], model):
                    problems.append(
                        PlanProblem(
                            code="wrong_executor",
                            message=f"pipeline {p.pipeline_id} gives {p.model_id} (executor "
                            f"{model.executor!r}) to node {s.node_id}, which runs "
                            f"{executor[s.node_id]!r}",
                        )
                    )
        for node_id, used in sorted(self.layers_used().items()):
            cap = capacity.get(node_id)
            if cap is not None and used > cap:
                problems.append(
                    PlanProblem(
                        code="capacity_exceeded",
                        message=f"node {node_id} is given {used} layers "
                        f"but declares capacity for {cap}",
                    )
                )
        return problems


def _duplicates(code: str, ids: Iterable[str]) -> list[PlanProblem]:
    seen: set[str] = set()
    out: list[PlanProblem] = []
    for i in ids:
        if i in seen:
            out.append(PlanProblem(code=code, message=f"{i!r} appears more than once"))
        seen.add(i)
    return out


def _coverage(p: Pipeline, layers: int) -> list[PlanProblem]:
    """Stages must tile ``[0, layers)`` in order: no gap, no overlap, nothing outside."""
    if not p.stages:
        return [PlanProblem(code="empty_pipeline", message=f"pipeline {p.pipeline_id} is empty")]
    out: list[PlanProblem] = []
    expected = 0
    for s in p.stages:
        where = f"pipeline {p.pipeline_id} stage {s.node_id}[{s.layer_start}, {s.layer_end})"
        if s.layer_end <= s.layer_start:
            out.append(PlanProblem(code="empty_stage", message=f"{where} holds no layer"))
        if s.layer_start > expected:
            out.append(
                PlanProblem(
                    code="gap",
                    message=f"{where}: layers [{expected}, {s.layer_start}) are not covered",
                )
            )
        elif s.layer_start < expected:
            out.append(
                PlanProblem(
                    code="overlap",
                    message=f"{where}: layers [{s.layer_start}, {min(expected, s.layer_end)}) "
                    "are covered twice",
                )
            )
        expected = max(expected, s.layer_end)
    if expected < layers:
        out.append(
            PlanProblem(
                code="gap",
                message=f"pipeline {p.pipeline_id}: layers [{expected}, {layers}) are not covered",
            )
        )
    elif expected > layers:
        out.append(
            PlanProblem(
                code="out_of_range",
                message=f"pipeline {p.pipeline_id} reaches layer {expected} "
                f"but model {p.model_id} has {layers}",
            )
        )
    return out


def covers_exactly(stages: tuple[Stage, ...], layers: int) -> bool:
    """True when ``stages`` tile ``[0, layers)`` contiguously, each holding a layer."""
    expected = 0
    for s in stages:
        if s.layer_start != expected or s.layer_end <= s.layer_start:
            return False
        expected = s.layer_end
    return expected == layers
