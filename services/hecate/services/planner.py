"""planner: membership in, the plan out (KV ``hecate-plan/current``; revision = epoch).

Listens: ``hecate.node.join`` / ``hecate.node.leave``.
Holds: the membership and a core :class:`Swarm` built with the chosen strategy.
Decides: the first plan once nodes stop arriving for ``settle_s``; after that, a joiner
goes through the core's growth policy (no reshuffle) and a leaver through retirement.
Publishes: the plan in KV (compare-and-set on the revision it last saw, so two planners
never overwrite each other blindly) and ``hecate.events.plan``. A (re)started planner
sends a roll-call so running nodes re-join, then plans with *its* strategy: swapping the
strategy is stopping one planner and starting another.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from opentelemetry.trace import TracerProvider

from hecate.bus import kv as kvs
from hecate.bus.logs import event
from hecate.bus.service import Service, encode
from hecate.core import (
    InsufficientCapacity,
    NodeProfile,
    Planner,
    Swarm,
    SwarmConfig,
)
from hecate.wire import subjects
from hecate.wire.messages import NodeJoin, NodeLeave, PlanChanged


class PlannerService:
    def __init__(
        self,
        config: SwarmConfig,
        planner: Planner,
        *,
        instance_id: str = "planner",
        settle_s: float = 0.5,
        log: logging.Logger,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.config = config
        self.planner = planner
        self.settle_s = settle_s
        self.log = log
        self.instance_id = instance_id
        self.service = Service(
            kind="planner",
            name=subjects.SERVICE_NAMES["planner"],
            instance_id=instance_id,
            description=f"plans layer ranges with the {planner.name!r} strategy",
            log=log,
            tracer_provider=tracer_provider,
            metadata={"strategy": planner.name},
        )
        self.members: dict[str, NodeProfile] = {}
        self.swarm: Swarm | None = None
        self.revision = 0
        self._changed = asyncio.Event()
        self._last_join = 0.0

    async def run(self, url: str, stop: asyncio.Event) -> None:
        svc = self.service
        await svc.start(url)
        self._kv = await kvs.bucket(svc.nc, subjects.PLAN_BUCKET)
        try:
            entry = await self._kv.get(subjects.PLAN_KEY)
            self.revision = int(entry.revision or 0)
        except Exception:
            self.revision = 0
        await svc.add_endpoint("join", subjects.NODE_JOIN, NodeJoin, self._on_join)
        await svc.add_endpoint("leave", subjects.NODE_LEAVE, NodeLeave, self._on_leave)
        await svc.ready()
        await svc.nc.publish(subjects.NODE_ROLL_CALL, b"{}")
        svc.spawn(self._planning())
        event(self.log, "planner ready", strategy=self.planner.name, revision=self.revision)
        await stop.wait()
        await svc.stop()

    async def _on_join(self, join: NodeJoin, _headers: Mapping[str, str]) -> None:
        profile = join.profile
        if self.members.get(profile.node_id) == profile:
            return  # a re-join (roll-call): nothing new
        self.members[profile.node_id] = profile
        self._last_join = time.monotonic()
        if self.swarm is not None:
            if profile.node_id in self.swarm.state.nodes:
                self.swarm.remove_node(profile.node_id)  # a changed profile: re-admit it
            growth = self.swarm.add_node(profile)
            event(
                self.log,
                "node joined",
                node_id=profile.node_id,
                growth=growth.kind,
                pipelines=list(growth.pipelines),
            )
            if growth.pipelines:
                self._changed.set()
        else:
            self._changed.set()

    async def _on_leave(self, leave: NodeLeave, _headers: Mapping[str, str]) -> None:
        if self.members.pop(leave.node_id, None) is None:
            return
        if self.swarm is not None and leave.node_id in self.swarm.state.nodes:
            removal = self.swarm.remove_node(leave.node_id)
            event(
                self.log,
                "node left",
                node_id=leave.node_id,
                relocated=len(removal.relocated),
                dropped=list(removal.dropped),
            )
            self._changed.set()

    async def _planning(self) -> None:
        while True:
            await self._changed.wait()
            if self.swarm is None:
                # Let a burst of joins settle so the first plan sees the whole swarm.
                while time.monotonic() - self._last_join < self.settle_s:
                    await asyncio.sleep(self.settle_s / 4)
                try:
                    self.swarm = Swarm(self.members.values(), self.config, planner=self.planner)
                except InsufficientCapacity as exc:
                    event(self.log, "waiting for capacity", logging.WARNING, reason=exc.message)
                    self._changed.clear()
                    continue
            self._changed.clear()
            await self._publish("membership changed")

    async def _publish(self, reason: str) -> None:
        assert self.swarm is not None
        plan = self.swarm.plan
        problems = plan.validate()
        if problems:  # never publish an invalid plan
            event(self.log, "plan rejected", logging.ERROR, problems=[str(p) for p in problems])
            return
        try:
            self.revision = await self._kv.update(
                subjects.PLAN_KEY, encode(plan), last=self.revision
            )
        except Exception as exc:
            # Someone else wrote the plan since we last looked: take their revision and
            # overwrite with ours (we are the planner now), but say so.
            event(self.log, "plan revision moved", logging.WARNING, error=repr(exc))
            self.revision = await self._kv.put(subjects.PLAN_KEY, encode(plan))
        change = PlanChanged(
            epoch=self.revision,
            strategy=self.planner.name,
            planner_id=self.instance_id,
            pipelines=len(plan.pipelines),
            reason=reason,
            at=time.time(),
        )
        await self.service.nc.publish(subjects.EVENT_PLAN, encode(change))
        event(
            self.log,
            "plan published",
            epoch=self.revision,
            pipelines=len(plan.pipelines),
            nodes=len(plan.nodes),
        )


def config_from_topology(data: bytes, pipelines: int | None = None) -> SwarmConfig:
    """The swarm's models and failover options from a topology file (nodes join by bus)."""
    from hecate.sim.topology import parse_topology

    topo = parse_topology(data)
    base = topo.base
    n = pipelines or 2
    return SwarmConfig(
        base.layers,
        n,
        model_id=base.id,
        models=tuple(m for m in topo.model_specs(n) if m.role != "base"),
        failover=topo.failover_options(),
    )
