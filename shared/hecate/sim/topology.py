"""The topology file read by ``hecate swarm-sim``: models, nodes, growth, one request.

Strict on purpose (unknown fields are refused): a typo in a config file must be an
error, not a silently ignored setting. Each model names the executor that computes it
(``toy`` unless it says otherwise), and a model that no node of the topology runs is an
error too: it would never be planned, and nothing else may serve it under its name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal

import msgspec

from hecate.core import FailoverOptions, HecateError, ModelSpec, NodeProfile, SwarmConfig
from hecate.core.plan import ModelRole, Slug, executes
from hecate.core.swarm import AUTO_FLOOR

NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Replicas = int | Literal["auto"]


class TopologyError(HecateError):
    """The topology file is malformed or inconsistent."""

    code = "bad_topology"


class ModelEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: Slug
    layers: Annotated[int, msgspec.Meta(ge=1)]
    role: ModelRole = "base"
    replicas: Annotated[int, msgspec.Meta(ge=0)] = 1
    executor: Slug = "toy"  # what computes it: only nodes running it get its layers

    def spec(self, replicas: Replicas | None = None) -> ModelSpec:
        """The model as the planner takes it; ``replicas`` overrides the file's count
        (``"auto"``: :data:`AUTO_FLOOR` copies, then as many as the nodes can form)."""
        count = self.replicas if replicas is None else replicas
        return ModelSpec(
            model_id=self.id,
            layers=self.layers,
            role=self.role,
            replicas=AUTO_FLOOR if count == "auto" else count,
            executor=self.executor,
            auto=count == "auto",
        )


class NodeEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: Slug
    capacity_layers: Annotated[int, msgspec.Meta(ge=0)]
    latency_ms: NonNegative = 0.0
    score: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    executor: Slug = "toy"  # what the node runs (``hecate node --executor``)

    def profile(self) -> NodeProfile:
        return NodeProfile(
            node_id=self.id,
            capacity_layers=self.capacity_layers,
            latency_ms=self.latency_ms,
            score=self.score,
            executor=self.executor,
        )


class RequestEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model_id: Slug | None = None
    tokens: Annotated[int, msgspec.Meta(ge=0)] = 0


class FailoverEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    allow_degraded: bool = False
    reserve_model: Slug | None = None


class Topology(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    models: Annotated[tuple[ModelEntry, ...], msgspec.Meta(min_length=1)]
    nodes: Annotated[tuple[NodeEntry, ...], msgspec.Meta(min_length=1)]
    growth: tuple[NodeEntry, ...] = ()
    request: RequestEntry = RequestEntry()
    failover: FailoverEntry = FailoverEntry()

    @property
    def base(self) -> ModelEntry:
        return next(m for m in self.models if m.role == "base")

    def model_specs(self, pipelines: Replicas) -> tuple[ModelSpec, ...]:
        """Every model as a spec; the base model gets ``pipelines`` replicas."""
        return tuple(m.spec(pipelines if m.role == "base" else None) for m in self.models)

    def swarm_config(self, pipelines: Replicas) -> SwarmConfig:
        """The swarm this topology describes: its base in ``pipelines`` copies, the
        other models beside it, each with the executor that computes it."""
        base = self.base
        return SwarmConfig(
            layers=base.layers,
            pipelines=pipelines,
            model_id=base.id,
            models=tuple(m for m in self.model_specs(pipelines) if m.role != "base"),
            failover=self.failover_options(),
            executor=base.executor,
        )

    def require_executors(self, nodes: Iterable[NodeEntry] | None = None) -> None:
        """Raise :class:`TopologyError` if a model needs an executor that none of ``nodes``
        (by default every node of the topology, growth included) runs."""
        nodes = tuple((*self.nodes, *self.growth) if nodes is None else nodes)
        for m in self.models:
            spec = m.spec()
            if not any(executes(n.executor, spec) for n in nodes):
                present = ", ".join(f"{n.id} ({n.executor})" for n in nodes) or "none"
                raise TopologyError(
                    f"model {m.id!r} needs executor {m.executor!r}, which no node runs "
                    f'(nodes: {present}); set "executor": "{m.executor}" on the nodes '
                    "that should serve it, or the model's executor to theirs"
                )

    def failover_options(self) -> FailoverOptions:
        return FailoverOptions(
            allow_degraded=self.failover.allow_degraded, reserve_model=self.failover.reserve_model
        )


_decoder = msgspec.json.Decoder(Topology)


def parse_topology(data: bytes) -> Topology:
    """Decode and cross-check a topology; :class:`TopologyError` says what is wrong and where."""
    try:
        topo = _decoder.decode(data)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise TopologyError(f"invalid topology: {exc}") from None
    bases = [m.id for m in topo.models if m.role == "base"]
    if len(bases) != 1:
        raise TopologyError(f"a topology needs exactly one model with role 'base', found {bases}")
    _unique("model", [m.id for m in topo.models])
    _unique("node", [n.id for n in (*topo.nodes, *topo.growth)])
    models = {m.id: m for m in topo.models}
    if topo.request.model_id is not None and topo.request.model_id not in models:
        raise TopologyError(
            f"request.model_id {topo.request.model_id!r} is not a model "
            f"of the topology ({', '.join(models)})"
        )
    reserve = topo.failover.reserve_model
    if reserve is not None and (reserve not in models or models[reserve].role != "reserve"):
        raise TopologyError(
            f"failover.reserve_model {reserve!r} must name a model with role 'reserve'"
        )
    topo.require_executors()
    return topo


def _unique(kind: str, ids: list[str]) -> None:
    seen: set[str] = set()
    for i in ids:
        if i in seen:
            raise TopologyError(f"{kind} id {i!r} appears more than once")
        seen.add(i)
