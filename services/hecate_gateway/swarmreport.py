"""What an operator sees of the swarm: the plan, laid over what telemetry and the
circuit breakers say. Pure: plain data in, plain data out, the clock passed in. The
recent events beside it are :mod:`hecate_gateway.swarmfeed`.

Words used here, and why they differ:

* A node is **up** when telemetry hears it, **draining** when it is up but leaving, and
  **down** otherwise (a node telemetry never heard of is down: nobody can vouch for it).
* A pipeline is **complete** when every node of it is up or draining (telemetry hears
  them all), and **servable** when a router would send to it: every node up, none
  draining, none behind a circuit that is not closed. This is how ``hecate status``
  decides (both are :meth:`SwarmState.pipeline_alive` over a different view of the nodes).
* A layer's **live replicas** are the distinct up nodes (draining ones are leaving) that
  host it in any pipeline of its model: how many more losses the layer survives. The
  minimum over the layers is what Petals' health monitor shows.
* A model is **servable** when one of its pipelines is, or, when none is, through a
  model of role ``reserve`` that is (the router's last resort, if it allows degraded
  answers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

from hecate.core.plan import ModelRole, SwarmPlan
from hecate.core.state import SwarmState
from hecate.core.telemetry import NodeState

Circuit = Literal["closed", "open", "half_open"]
Health = Literal["up", "down", "draining"]


class NodeSeen(msgspec.Struct, frozen=True, kw_only=True):
    """What telemetry last said of one node."""

    alive: bool = False
    draining: bool = False
    latency_ms: float | None = None
    load: float | None = None
    in_flight: int = 0
    last_seen: float | None = None
    memory_used: int = 0


class NodeReport(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    health: Health
    circuit: Circuit
    serving: bool  # a router would send to it: up and its circuit closed
    in_plan: bool
    latency_ms: float | None
    load: float | None
    in_flight: int
    last_seen: float | None
    memory_used: int = 0  # bytes, as the node last beat
    memory_bytes: int = 0  # its limit, as it joined (0: not said)
    memory_from: str = ""


class StageReport(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    layer_start: int
    layer_end: int


class PipelineReport(msgspec.Struct, frozen=True, kw_only=True):
    pipeline_id: str
    complete: bool
    servable: bool
    stages: tuple[StageReport, ...]


class ModelReport(msgspec.Struct, frozen=True, kw_only=True):
    model_id: str
    role: ModelRole
    layers: int
    replicas_wanted: int
    pipelines: tuple[PipelineReport, ...]
    complete_pipelines: int
    servable_pipelines: int
    live_replicas: tuple[int, ...]  # per layer, 0 .. layers-1
    min_live_replicas: int
    servable: bool
    via_reserve: str | None  # servable only through this reserve model


class SwarmReport(msgspec.Struct, frozen=True, kw_only=True):
    has_plan: bool
    epoch: int
    nodes_up: int
    nodes_down: int
    nodes_draining: int
    nodes: tuple[NodeReport, ...]
    models: tuple[ModelReport, ...]

    def servable_models(self) -> list[str]:
        return [m.model_id for m in self.models if m.servable]


EMPTY = SwarmReport(
    has_plan=False, epoch=0, nodes_up=0, nodes_down=0, nodes_draining=0, nodes=(), models=()
)


def health(seen: NodeSeen | None) -> Health:
    if seen is None or not seen.alive:
        return "down"
    return "draining" if seen.draining else "up"


def live_replicas(plan: SwarmPlan, model_id: str, layers: int, live: Iterable[str]) -> list[int]:
    """For each layer of ``model_id``, how many distinct ``live`` nodes host it in any
    of its pipelines (a node in two pipelines over the same layer dies once)."""
    alive = set(live)
    hosts: list[set[str]] = [set() for _ in range(layers)]
    for p in plan.pipelines_of(model_id):
        for s in p.stages:
            if s.node_id in alive:
                for layer in range(max(s.layer_start, 0), min(s.layer_end, layers)):
                    hosts[layer].add(s.node_id)
    return [len(h) for h in hosts]


def report(
    plan: SwarmPlan | None,
    epoch: int,
    seen: Mapping[str, NodeSeen],
    circuits: Mapping[str, Circuit],
) -> SwarmReport:
    """The plan over telemetry (``seen``, by node) and the circuits not closed (by
    target; a target absent is closed)."""
    if plan is None:
        return EMPTY
    planned = {n.node_id for n in plan.nodes}
    profiles = {n.node_id: n for n in plan.nodes}
    nodes = []
    for node_id in sorted(planned | set(seen)):
        s = seen.get(node_id)
        profile = profiles.get(node_id)
        h = health(s)
        circuit = circuits.get(node_id, "closed")
        nodes.append(
            NodeReport(
                node_id=node_id,
                health=h,
                circuit=circuit,
                serving=h == "up" and circuit == "closed",
                in_plan=node_id in planned,
                latency_ms=s.latency_ms if s else None,
                load=s.load if s else None,
                in_flight=s.in_flight if s else 0,
                last_seen=s.last_seen if s else None,
                memory_used=s.memory_used if s else 0,
                memory_bytes=profile.memory_bytes if profile else 0,
                memory_from=profile.memory_from if profile else "",
            )
        )
    by_id = {n.node_id: n for n in nodes}
    heard = SwarmState(plan, {i: NodeState(alive=n.health != "down") for i, n in by_id.items()})
    usable = SwarmState(plan, {i: NodeState(alive=n.serving) for i, n in by_id.items()})
    live = [n.node_id for n in nodes if n.health == "up"]

    models: list[ModelReport] = []
    for m in plan.models:
        pipelines = tuple(
            PipelineReport(
                pipeline_id=p.pipeline_id,
                complete=heard.pipeline_alive(p),
                servable=usable.pipeline_alive(p),
                stages=tuple(
                    StageReport(node_id=s.node_id, layer_start=s.layer_start, layer_end=s.layer_end)
                    for s in p.stages
                ),
            )
            for p in plan.pipelines_of(m.model_id)
        )
        replicas = live_replicas(plan, m.model_id, m.layers, live)
        servable = sum(p.servable for p in pipelines)
        models.append(
            ModelReport(
                model_id=m.model_id,
                role=m.role,
                layers=m.layers,
                replicas_wanted=m.replicas,
                pipelines=pipelines,
                complete_pipelines=sum(p.complete for p in pipelines),
                servable_pipelines=servable,
                live_replicas=tuple(replicas),
                min_live_replicas=min(replicas, default=0),
                servable=servable > 0,
                via_reserve=None,
            )
        )
    # A model none of whose planned pipelines serves is still answered (degraded) by a
    # reserve model that serves; one with no pipeline at all was never meant to be.
    reserves = [m.model_id for m in models if m.role == "reserve" and m.servable]
    models = [
        msgspec.structs.replace(m, servable=True, via_reserve=reserves[0])
        if not m.servable and m.pipelines and m.role != "reserve" and reserves
        else m
        for m in models
    ]
    return SwarmReport(
        has_plan=True,
        epoch=epoch,
        nodes_up=sum(n.health == "up" for n in nodes),
        nodes_down=sum(n.health == "down" for n in nodes),
        nodes_draining=sum(n.health == "draining" for n in nodes),
        nodes=tuple(nodes),
        models=tuple(models),
    )
