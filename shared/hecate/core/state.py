"""``SwarmState = plan + nodes``: the expensive, rare part and the cheap, constant part.

A state is immutable: every change returns a new state with a higher ``version``.
That makes the per-state cost cache always valid: pipeline costs are computed once per
(state, model, weights) on first use, and every routing decision on the same snapshot is a
lookup. Re-planning per request is forbidden; re-costing per snapshot is microseconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from hecate.core.cost import (
    DEFAULT_PENALTY,
    DEFAULT_WEIGHTS,
    ColdPenalty,
    RouteWeights,
    hop_cost,
    stage_cost,
)
from hecate.core.errors import UnknownNode
from hecate.core.plan import NodeProfile, Pipeline, SwarmPlan
from hecate.core.telemetry import DEFAULT_ALPHA, NodeState, Sample, observe

CostTable = tuple[tuple[float, str, Pipeline], ...]
"""Healthy pipelines of one model as ``(cost, pipeline_id, pipeline)``, cheapest first."""


class SwarmState:
    """The plan and the latest telemetry of every node it names."""

    __slots__ = ("_cache", "_profiles", "nodes", "plan", "version")

    def __init__(self, plan: SwarmPlan, nodes: Mapping[str, NodeState], version: int = 0) -> None:
        self.plan = plan
        self.nodes: Mapping[str, NodeState] = MappingProxyType(dict(nodes))
        self.version = version
        self._profiles = {p.node_id: p for p in plan.nodes}
        self._cache: dict[tuple[str, RouteWeights, ColdPenalty], CostTable] = {}

    @classmethod
    def from_plan(cls, plan: SwarmPlan) -> SwarmState:
        """Cold telemetry: every node alive, nothing measured yet."""
        return cls(plan, {n.node_id: NodeState() for n in plan.nodes})

    @classmethod
    def from_profiles(
        cls, plan: SwarmPlan, profiles: Iterable[NodeProfile] | None = None
    ) -> SwarmState:
        """Telemetry seeded with each node's declared latency and score (load still unknown)."""
        chosen = {p.node_id: p for p in (plan.nodes if profiles is None else profiles)}
        nodes = {}
        for n in plan.nodes:
            p = chosen.get(n.node_id)
            nodes[n.node_id] = (
                NodeState() if p is None else NodeState(latency_ms=p.latency_ms, score=p.score)
            )
        return cls(plan, nodes)

    # -- reading ---------------------------------------------------------------------

    def node(self, node_id: str) -> NodeState:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise UnknownNode(
                f"node {node_id!r} is not a member of plan epoch {self.plan.epoch}"
            ) from None

    def profile(self, node_id: str) -> NodeProfile | None:
        return self._profiles.get(node_id)

    def is_alive(self, node_id: str) -> bool:
        n = self.nodes.get(node_id)
        return n is not None and n.alive

    def live_nodes(self) -> list[str]:
        return [i for i, n in self.nodes.items() if n.alive]

    def pipeline_alive(self, p: Pipeline) -> bool:
        return all(self.is_alive(s.node_id) for s in p.stages)

    def ages(self, now: float) -> dict[str, float]:
        """Seconds since each node was last measured (``inf``: never)."""
        return {i: n.age(now) for i, n in self.nodes.items()}

    def stale(self, now: float, max_age_s: float) -> list[str]:
        """Nodes whose telemetry is older than ``max_age_s`` (or missing), sorted."""
        return sorted(i for i, n in self.nodes.items() if n.age(now) > max_age_s)

    # -- changing (each returns a new state) -----------------------------------------

    def with_node(self, node_id: str, node: NodeState) -> SwarmState:
        self.node(node_id)
        nodes = dict(self.nodes)
        nodes[node_id] = node
        fresh = SwarmState.__new__(SwarmState)  # same plan: share its profile index
        fresh.plan, fresh.nodes, fresh.version = (
            self.plan,
            MappingProxyType(nodes),
            self.version + 1,
        )
        fresh._profiles, fresh._cache = self._profiles, {}
        return fresh

    def mark(self, node_id: str, *, alive: bool) -> SwarmState:
        n = self.node(node_id)
        if n.alive == alive:
            return self
        return self.with_node(
            node_id,
            NodeState(
                alive=alive,
                latency_ms=n.latency_ms,
                load=n.load,
                score=n.score,
                last_seen=n.last_seen,
                in_flight=n.in_flight if alive else 0,
            ),
        )

    def observe(
        self, node_id: str, sample: Sample, *, now: float, alpha: float = DEFAULT_ALPHA
    ) -> SwarmState:
        return self.with_node(node_id, observe(self.node(node_id), sample, now=now, alpha=alpha))

    def with_plan(self, plan: SwarmPlan) -> SwarmState:
        """Adopt a new plan, keeping what is known of nodes that stay (cold for newcomers)."""
        nodes = {n.node_id: self.nodes.get(n.node_id, NodeState()) for n in plan.nodes}
        return SwarmState(plan, nodes, self.version + 1)

    # -- costs -----------------------------------------------------------------------

    def pipeline_cost(
        self,
        p: Pipeline,
        weights: RouteWeights = DEFAULT_WEIGHTS,
        penalty: ColdPenalty = DEFAULT_PENALTY,
    ) -> float:
        """``cost(P)`` without the per-request token term."""
        total = hop_cost(len(p.stages), weights)
        for s in p.stages:
            total += stage_cost(
                self.nodes[s.node_id], self._profiles.get(s.node_id), weights, penalty
            )
        return total

    def cost_table(
        self,
        model_id: str,
        weights: RouteWeights = DEFAULT_WEIGHTS,
        penalty: ColdPenalty = DEFAULT_PENALTY,
    ) -> CostTable:
        """Healthy pipelines of ``model_id``, cheapest first, ties by ``pipeline_id``.

        Computed once per state and cached: the state never changes, so neither does this.
        """
        key = (model_id, weights, penalty)
        table = self._cache.get(key)
        if table is None:
            rows = [
                (self.pipeline_cost(p, weights, penalty), p.pipeline_id, p)
                for p in self.plan.pipelines
                if p.model_id == model_id and self.pipeline_alive(p)
            ]
            rows.sort(key=lambda r: (r[0], r[1]))
            table = tuple(rows)
            self._cache[key] = table
        return table
