"""planner: membership in, the plan out (KV ``hecate-plan/current``; revision = epoch).

Listens: ``hecate.node.*.join`` / ``hecate.node.*.leave``, each taken only when the
node its subject names is the node its body names (:mod:`.vouching`); and telemetry's
``hecate.events.node.down`` / ``.up``: a member down ``retire_after_s`` (5 s) leaves the
plan as a leaver does (no reshuffle), and comes back through growth when it is heard
again.
Holds: the membership (each node's profile with the executor it runs) and a core
:class:`Swarm` built with the chosen strategy, in :class:`.membership.Membership` (no
I/O: this module is the shell that feeds it what it hears and publishes its plans). A
model's layers go only to nodes running its executor; a model no member runs is not
planned, and is logged once as such.
Decides: the first plan once nodes stop arriving for ``settle_s``; after that, a joiner
goes through the core's growth policy (no reshuffle) and a leaver through retirement.
Publishes: the plan in KV, then each node's share of it that changed (KV
``hecate-plan/node.<id>``, :mod:`.assignments`), then ``hecate.events.plan`` naming
those nodes; the notice again every ``remind_s`` with the members heard so far (a
node that missed one reads its share, and every node paces its heartbeats by the
swarm's size, plan or no plan yet). A (re)started planner sends a roll-call so running
nodes re-join, then plans with *its* strategy: swapping the strategy is stopping one
planner and starting another.

Two planners at once never overwrite each other blindly. Every write is a compare-and-set
on the revision this planner last read, and it follows the key: a plan another planner
writes becomes the one it carries on from (its own membership applied through growth and
retirement, no reshuffle), and a lost compare-and-set is answered the same way, re-read
and re-planned. A plan identical to the stored one is not written again; after
``CAS_ROUNDS`` lost rounds the planner steps down for that change and waits for the
next. Only a plan written before this planner started is replaced by a fresh one.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec
from opentelemetry.trace import TracerProvider

from hecate.bus import kv as kvs
from hecate.bus.logs import event
from hecate.bus.service import Service, encode
from hecate.bus.vouching import NodeIdentity
from hecate.core import InsufficientCapacity, Planner, SwarmPlan
from hecate.wire import subjects
from hecate.wire.messages import Held, NodeEvent, NodeJoin, NodeLeave, PlanChanged
from hecate_planner import assignments
from hecate_planner.config import PlannerConfig
from hecate_planner.membership import Membership
from hecate_planner.planstore import PlanStore, plan_digest, same_plan

__all__ = ["CAS_ROUNDS", "PlannerService", "plan_digest"]

CAS_ROUNDS = 5
WRITERS = 128  # shares written at once


class PlannerService:
    def __init__(
        self,
        config: PlannerConfig,
        planner: Planner,
        *,
        log: logging.Logger,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.settings = config
        self.planner = planner
        self.settle_s = config.settle_s
        self.log = log
        self.instance_id = config.instance_id
        self.service = Service(
            kind="planner",
            name=subjects.SERVICE_NAMES["planner"],
            instance_id=config.instance_id,
            description=f"plans layer ranges with the {planner.name!r} strategy",
            log=log,
            tracer_provider=tracer_provider,
            metadata={"strategy": planner.name},
        )
        self.view = Membership(config.swarm, planner, log, config.profile_pace_s)
        self.revision = 0  # of the stored plan this planner last read or wrote
        self.stored: SwarmPlan | None = None  # the plan at that revision
        self._start_revision = 0
        self._lock = asyncio.Lock()  # one reader-writer of the key at a time
        self._changed = asyncio.Event()
        self.conflicts = 0
        self.adopted = 0
        self.written: dict[str, tuple[Held, ...]] = {}  # each node's share, as its key holds it
        self._assigned_at = 0  # the revision whose shares are all written
        self._notice: PlanChanged | None = None  # the latest said
        self.identity = NodeIdentity(log)

    async def run(self, url: str, stop: asyncio.Event) -> None:
        svc = self.service
        await svc.start(url)
        self._store = PlanStore(await kvs.bucket(svc.nc, subjects.PLAN_BUCKET), self.instance_id)
        self.stored, self.revision = await self._store.read()
        self._start_revision = self.revision
        guard = self.identity.guard
        joins = await svc.add_endpoint(
            "join",
            subjects.NODE_JOIN_ALL,
            NodeJoin,
            guard(self._on_join, lambda join: join.profile.node_id),
            deferred=True,
        )
        joins.status = lambda: {
            "epoch": self.revision,
            "plan": plan_digest(self.stored) if self.stored is not None else "",
            "members": len(self.view.members),
            "silent": len(self.view.silent),
            "pending": self._changed.is_set() or self._lock.locked(),
            "conflicts": self.conflicts,
            "adopted": self.adopted,
            "identity_mismatch": self.identity.refused,
        }
        await svc.add_endpoint(
            "leave",
            subjects.NODE_LEAVE_ALL,
            NodeLeave,
            guard(self._on_leave, lambda leave: leave.node_id),
            deferred=True,
        )
        # Telemetry's word on liveness (only telemetry may publish it on a locked-down
        # bus): a member called down leaves the plan, and comes back when heard again.
        await svc.add_endpoint("node-down", subjects.EVENT_NODE_DOWN, NodeEvent, self._on_down)
        await svc.add_endpoint("node-up", subjects.EVENT_NODE_UP, NodeEvent, self._on_up)
        await svc.ready()
        await svc.nc.publish(subjects.NODE_ROLL_CALL, b"{}")
        svc.spawn(self._follow())
        svc.spawn(self._planning())
        svc.spawn(self._remind())
        svc.spawn(self._retirements())
        event(self.log, "planner ready", strategy=self.planner.name, revision=self.revision)
        await stop.wait()
        await svc.stop()

    async def _on_join(self, join: NodeJoin) -> None:
        # The join's own field is what every node has always sent; the profile carries it
        # on into the plan, where the strategy and the nodes read it.
        profile = msgspec.structs.replace(join.profile, executor=join.executor)
        if self.view.admit(profile, time.monotonic()):
            self._changed.set()

    async def _on_leave(self, leave: NodeLeave) -> None:
        if self.view.leave(leave.node_id):
            self._changed.set()

    async def _on_down(self, news: NodeEvent, _headers: object) -> None:
        self.view.down(news, time.monotonic())

    async def _on_up(self, news: NodeEvent, _headers: object) -> None:
        if self.view.up(news, time.monotonic()):
            self._changed.set()

    async def _retirements(self) -> None:
        """Members down ``retire_after_s`` leave the plan (:meth:`Membership.retire_due`);
        profile changes held for their turn are planned (:meth:`Membership.changes_due`)."""
        wait = self.settings.retire_after_s
        while True:
            await asyncio.sleep(min(0.25, wait / 4))
            now = time.monotonic()
            if self.view.retire_due(now, wait) | self.view.changes_due(now):
                self._changed.set()

    async def _planning(self) -> None:
        while True:
            await self._changed.wait()
            if self.view.swarm is None:
                # Let a burst of joins settle so the first plan sees the whole swarm.
                while time.monotonic() - self.view.last_join < self.settle_s:
                    await asyncio.sleep(self.settle_s / 4)
            self.view.report_unexecutable()
            if self.view.swarm is None:
                async with self._lock:
                    if self.stored is not None and self.revision > self._start_revision:
                        # Another planner published since we started: carry on from it.
                        self._resume(self.stored, self.revision)
                    else:
                        try:
                            self.view.form()
                        except InsufficientCapacity as exc:
                            event(
                                self.log,
                                "waiting for capacity",
                                logging.WARNING,
                                reason=exc.message,
                            )
                            self._changed.clear()
                            continue
            self._changed.clear()
            try:
                await self._publish("membership changed")
            except Exception as exc:  # the server away: try again, never write blind
                event(self.log, "plan not published", logging.WARNING, error=repr(exc))
                await asyncio.sleep(self.settle_s)
                self._changed.set()

    # -- the plan in KV ------------------------------------------------------------------

    async def _follow(self) -> None:
        """Another planner's write becomes the plan this one carries on from."""
        async for theirs, revision in self._store.follow(self._bad_plan):
            async with self._lock:
                if revision <= self.revision:
                    continue  # our own write, or one already taken
                self._take(theirs, revision)

    def _bad_plan(self, revision: int, exc: msgspec.DecodeError) -> None:
        """A stored plan that does not decode: replaced by this planner's next write
        (which, written on an older revision, fails, reads the bad one and writes over it)."""
        event(self.log, "bad plan in the store", logging.ERROR, revision=revision, error=str(exc))
        self._changed.set()

    def _take(self, theirs: SwarmPlan | None, revision: int) -> None:
        """Record the stored plan at ``revision`` and, once planning, carry on from it."""
        self.stored, self.revision = theirs, revision
        # Its writer writes its shares; which ones, this planner did not see, so its
        # own next plan writes them all.
        self.written.clear()
        self._assigned_at = revision
        if self.view.swarm is None or theirs is None or theirs.validate():
            return  # nothing to carry on from: our next write replaces it, knowingly
        self._resume(theirs, revision)

    def _resume(self, theirs: SwarmPlan, revision: int) -> None:
        """Carry on from ``theirs`` (:meth:`Membership.resume`); publish if what this
        planner knows of the membership changed it."""
        self.adopted += 1
        mine = self.view.resume(theirs)
        event(
            self.log,
            "plan adopted",
            epoch=revision,
            pipelines=len(theirs.pipelines),
            replanned=mine,
        )
        if mine:
            self._changed.set()

    async def _publish(self, reason: str) -> None:
        async with self._lock:
            for _ in range(CAS_ROUNDS):
                assert self.view.swarm is not None
                plan = self.view.swarm.plan
                problems = plan.validate()
                if problems:  # never publish an invalid plan
                    event(
                        self.log,
                        "plan rejected",
                        logging.ERROR,
                        problems=[str(p) for p in problems],
                    )
                    return
                if same_plan(plan, self.stored):
                    # Stored already, by us or by another planner: its shares are
                    # written, unless this planner (or that one) stopped short of it.
                    if self._assigned_at < self.revision:
                        await self._assign(plan, self.revision, "shares completed", fresh=False)
                    return
                on = self.revision
                written = await self._store.write(plan, on)
                if written is None:
                    # Someone wrote since we last read: re-read, re-plan on top of theirs.
                    self.conflicts += 1
                    theirs, revision = await self._store.read()
                    event(
                        self.log,
                        "plan revision moved",
                        logging.WARNING,
                        expected=on,
                        found=revision,
                    )
                    self._take(theirs, revision)
                    continue
                self.revision, self.stored = written, plan
                await self._assign(plan, on, reason)
                return
            event(
                self.log,
                "plan not published",
                logging.WARNING,
                reason=f"lost {CAS_ROUNDS} compare-and-set rounds: another planner is writing",
            )

    async def _assign(self, plan: SwarmPlan, on: int, reason: str, *, fresh: bool = True) -> None:
        """Write each node's share of the plan stored at ``self.revision`` that it
        changed, then announce the plan. A write that fails raises (the planning loop
        tries again); the shares written before it are not written again."""
        epoch, nodes = self.revision, len(plan.nodes)
        todo = list(assignments.changes(self.written, plan).items())
        for i in range(0, len(todo), WRITERS):
            batch = todo[i : i + WRITERS]
            await asyncio.gather(*(self._write_share(n, held, epoch, nodes) for n, held in batch))
        self._assigned_at = epoch
        await self._announce(
            plan, on, reason, assignments.named(dict(todo)), fresh=fresh, shares=len(todo)
        )

    async def _write_share(
        self, node_id: str, held: tuple[Held, ...], epoch: int, nodes: int
    ) -> None:
        await self._store.put_share(node_id, held, epoch=epoch, nodes=nodes)
        self.written[node_id] = held

    async def _remind(self) -> None:
        """Say the latest notice again now and then: it is fire-and-forget, and a node
        that missed it reads its share when it hears this one. It carries the members
        heard so far, plan or no plan yet: what nodes pace their heartbeats by, so that
        a swarm forming slows its beats before its first plan (thousands of nodes
        beating at the pace of a few overran this machine as they joined)."""
        while True:
            await asyncio.sleep(self.settings.remind_s)
            said = self._notice
            if said is not None and self._assigned_at == said.epoch:
                again = msgspec.structs.replace(
                    said,
                    previous=said.epoch,
                    changed=(),
                    nodes=max(said.nodes, len(self.view.members)),
                    reason="reminder",
                    at=time.time(),
                )
            elif said is None and self.view.members:
                again = PlanChanged(
                    epoch=self.revision,
                    strategy=self.planner.name,
                    planner_id=self.instance_id,
                    pipelines=0,
                    reason="members",
                    at=time.time(),
                    previous=self.revision,
                    nodes=len(self.view.members),
                    changed=(),
                )
            else:
                continue
            await self.service.nc.publish(subjects.EVENT_PLAN, encode(again))

    async def _announce(
        self,
        plan: SwarmPlan,
        on: int,
        reason: str,
        changed: tuple[str, ...] | None,
        *,
        fresh: bool,
        shares: int,
    ) -> None:
        change = PlanChanged(
            epoch=self.revision,
            strategy=self.planner.name,
            planner_id=self.instance_id,
            pipelines=len(plan.pipelines),
            reason=reason,
            at=time.time(),
            previous=on,
            nodes=len(plan.nodes),
            changed=changed,
        )
        self._notice = change
        await self.service.nc.publish(subjects.EVENT_PLAN, encode(change))
        event(
            self.log,
            "plan published" if fresh else "plan shares written",
            epoch=self.revision,
            on=on,
            pipelines=len(plan.pipelines),
            nodes=len(plan.nodes),
            spare=len(plan.spare_nodes()),
            shares=shares,
        )
