"""What a node holds: the ranges the latest plan gives it, loaded and measured.

A node reads its own share of the plan, never the whole plan (which grows with the
swarm): the key ``hecate-plan/node.<id>`` the planner writes after each plan that
changes it. It reads it at start; when a plan notice (``hecate.events.plan``, a plain
subscription) names it, names nobody, or follows one it missed; and when a stage names
a newer epoch for a range it does not hold (it waits, briefly, for a share the planner
is still writing). No JetStream consumer per node, and a plan that moves a few nodes
costs the others a notice. A share that does not decode (written by hand, or by a
planner of another version) is logged, counted and skipped: the node keeps what it
holds. A range of a model declared for another executor is refused (logged, then
``not_hosted``): better than served by another network under the model's name. Newly
held ranges are loaded off the event loop and warmed up (a timed pass), and an idle node
measures itself again now and then, so the latency it announces is one it measured, and
a recent one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

import msgspec
from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from hecate.bus import kv as kvs
from hecate.bus.logs import event
from hecate.model.footprint import Range, Refusal
from hecate.wire import subjects
from hecate.wire.messages import Assignment, PlanChanged
from hecate_node.executor import Holding, Runner
from hecate_node.meter import StageMeter
from hecate_node.room import Room

_share = msgspec.json.Decoder(Assignment)
_notice = msgspec.json.Decoder(PlanChanged)
#: How long a stage naming a newer plan waits for the node's share of it (the planner
#: writes the plan first, then the shares).
CATCH_UP_S = 2.0
#: A notice that names nobody has every node read its share: they spread their reads
#: so that the swarm's come to about this many a second (within MOST_SPREAD_S), not
#: all in the instant the notice lands.
READS_PER_S = 2000.0
MOST_SPREAD_S = 5.0


class Holdings:
    #: True while ranges a plan newly gives the node are loaded and warmed up: the
    #: node's heartbeats say so.
    loading = False
    #: Awaited as loading starts (True), before anything is loaded, and as it ends
    #: (False): the node beats at once, as the load may hold its interpreter, and its
    #: next beat with it, and a load done is news as soon.
    on_loading: Callable[[bool], Awaitable[None]] | None = None
    #: The node's room for its model, once weighed: ranges that do not fit are refused.
    room: Room | None = None
    #: Awaited when a plan gives ranges that do not fit (the refusal, the ranges kept).
    on_refused: Callable[[Refusal, list[Range]], Awaitable[None]] | None = None

    def __init__(
        self,
        node_id: str,
        executor: str,
        runner: Runner,
        meter: StageMeter,
        *,
        log: logging.Logger,
        spawn: Callable[[Awaitable[None]], object],
        slow_down: Callable[[], Awaitable[None]],
        draining: Callable[[], bool],
        remeasure_s: float,
    ) -> None:
        self.node_id = node_id
        self.executor = executor
        self.runner = runner
        self.meter = meter
        self.log = log
        self.spawn = spawn
        self.slow_down = slow_down  # the injected delay, awaited inside a timed pass
        self.draining = draining
        self.remeasure_s = remeasure_s
        self.epoch = 0
        self.swarm_nodes = 0  # the nodes of the plan held: how many beat
        self.held: list[Holding] = []
        self._warmed: set[Holding] = set()  # holdings whose warm-up has been started
        self._preparing = asyncio.Lock()  # one plan's loading and warm-up at a time, in order
        self._kv: KeyValue | None = None  # the plan bucket, once it exists
        self._reading = asyncio.Lock()  # one read of the share at a time
        self.share_epoch = 0  # the plan that last changed the share held
        self.bad_plans = 0  # shares and notices that did not decode, each once
        self._bad_revision = 0  # the latest bad share's revision

    def hosts(self, model_id: str, start: int, end: int) -> bool:
        return any(m == model_id and a <= start and end <= b for m, a, b in self.held)

    async def follow(self, nc: Client) -> None:
        """Hold what every plan gives this node: its share read at start (once the
        planner has created the bucket), then again whenever a notice calls for it."""
        notices = await nc.subscribe(subjects.EVENT_PLAN)  # first: none missed meanwhile
        try:
            # The planner creates the bucket before its first notice: a node that starts
            # first waits for that notice, rather than poll for the bucket (a thousand
            # nodes polling cost more than all their heartbeats).
            self._kv = await kvs.find_bucket(nc, subjects.PLAN_BUCKET)
            if self._kv is not None:
                await self._read()
            async for msg in notices.messages:
                try:
                    notice = _notice.decode(msg.data)
                except msgspec.DecodeError as exc:
                    self._bad(0, exc, "plan notice")
                    continue
                if self._kv is None:  # unreachable now: the next notice (or reminder) again
                    self._kv = await kvs.find_bucket(nc, subjects.PLAN_BUCKET)
                await self.heard(notice)
        finally:
            await notices.unsubscribe()

    async def heard(self, notice: PlanChanged) -> None:
        """A plan notice: read the share when it says this node's changed, names
        nobody, or follows a plan this node did not hear of."""
        if notice.nodes:
            self.swarm_nodes = notice.nodes
        if notice.epoch <= self.epoch:
            return
        everyone = notice.changed is None or self.epoch < notice.previous
        if not everyone and self.node_id not in (notice.changed or ()):
            self.epoch = notice.epoch  # nothing of this node's changed
            return
        if everyone:
            spread = min(MOST_SPREAD_S, max(self.swarm_nodes, 1) / READS_PER_S)
            await asyncio.sleep(random.uniform(0, spread))
        if not await self._read():
            return  # unread: the next notice (or its reminder) calls for it again
        self.epoch = max(self.epoch, notice.epoch)

    async def catch_up(self, epoch: int) -> None:
        """A stage names a plan newer than the one this node heard of, for a range it
        does not hold: read its share now rather than wait for the notice, and again
        while the planner may still be writing it (up to :data:`CATCH_UP_S`)."""
        deadline = time.monotonic() + CATCH_UP_S
        while self.epoch < epoch and self.share_epoch < epoch and self._kv is not None:
            async with self._reading:
                if self.epoch >= epoch or self.share_epoch >= epoch:
                    break  # another stage's read found it meanwhile
                await self._read(locked=True)
            if self.share_epoch >= epoch or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        self.epoch = max(self.epoch, min(epoch, self.share_epoch))

    async def _read(self, *, locked: bool = False) -> bool:
        """Read this node's share and hold it: False when it could not be read (the
        bucket not found yet, the server away) or did not decode (logged and counted,
        the holdings kept)."""
        if self._kv is None:
            return False
        if not locked:
            async with self._reading:
                return await self._read(locked=True)
        try:
            entry = await self._kv.get(subjects.assignment_key(self.node_id))
        except KeyNotFoundError:
            return True  # never given anything: nothing to hold yet
        except Exception as exc:  # disconnected, timed out: asked again later
            event(self.log, "share not read", logging.WARNING, error=repr(exc))
            return False
        revision = int(entry.revision or 0)
        try:
            share = _share.decode(entry.value or b"")
        except msgspec.DecodeError as exc:
            if revision != self._bad_revision:
                self._bad_revision = revision
                self._bad(revision, exc, "share")
            return False
        if share.node_id != self.node_id:
            self._bad(revision, msgspec.DecodeError(f"the share of {share.node_id}"), "share")
            return False
        self.adopt(share)
        return True

    def _bad(self, revision: int, exc: msgspec.DecodeError, what: str) -> None:
        """A share or a notice that does not decode: counted, logged and skipped."""
        self.bad_plans += 1
        event(
            self.log,
            f"bad {what} skipped",
            logging.ERROR,
            revision=revision,
            error=str(exc),
            bad_plans=self.bad_plans,
            epoch=self.epoch,
        )

    def adopt(self, share: Assignment) -> None:
        self.share_epoch = share.epoch
        if share.epoch >= self.epoch and share.nodes:
            self.swarm_nodes = share.nodes
        self.epoch = max(self.epoch, share.epoch)
        given = [(h.model_id, h.layer_start, h.layer_end) for h in share.holdings]
        # The planner never does this; a share written by hand or by a stale planner
        # might, and a range is better refused (``not_hosted``) than served by another
        # network under the model's name.
        refused = {h.model_id: h.executor for h in share.holdings if h.executor != self.executor}
        for model_id, executor in sorted(refused.items()):
            event(
                self.log,
                "ranges refused: the model needs another executor",
                logging.ERROR,
                model_id=model_id,
                executor=executor,
                node_executor=self.executor,
            )
        held = [h for h in given if h[0] not in refused]
        self.held = self._within_memory(held) if self.room is not None else held
        event(self.log, "plan adopted", epoch=share.epoch, holdings=self.held)
        fresh = [h for h in dict.fromkeys(self.held) if h not in self._warmed]
        self._warmed = {h for h in self._warmed if h in self.held} | set(fresh)
        self.spawn(self._prepare(fresh))

    def _within_memory(self, given: list[Holding]) -> list[Holding]:
        """Of the ranges ``given``, those that fit the node's memory beside what it has
        loaded; the others refused before a weight of them is read, naming the bytes."""
        assert self.room is not None
        loaded = [(a, b) for _m, a, b in self.held if (_m, a, b) in self._warmed]
        keep, refusal = self.room.admit(loaded, [(a, b) for _m, a, b in given])
        if refusal is None:
            return given
        event(
            self.log,
            "ranges refused: they do not fit this node's memory",
            logging.ERROR,
            refused=str(refusal),
            need=refusal.need.total,
            budget=refusal.budget,
        )
        if self.on_refused is not None:
            self.spawn(self.on_refused(refusal, keep))
        return [h for h in given if (h[1], h[2]) in keep]

    async def _prepare(self, fresh: list[Holding]) -> None:
        """Load the held ranges now, off the event loop, not at first use; then warm up
        the ones this plan newly gives the node. Requests are served meanwhile."""
        async with self._preparing, self._loading(bool(fresh)):
            try:
                await self.runner.prepare([(a, b) for _m, a, b in self.held])
            except Exception as exc:  # a stage loads its range itself, or says why not
                event(self.log, "prepare failed", logging.WARNING, error=repr(exc))
                return
            await self.warm_up(fresh)

    @contextlib.asynccontextmanager
    async def _loading(self, fresh: bool) -> AsyncIterator[None]:
        """Loading, when the plan gives the node ranges it has not loaded: a plan that
        only drops ranges, or gives the same again, loads nothing, and a node that said
        it was loading is allowed a load's silence (10 s), not its pace's."""
        if not fresh:
            yield
            return
        self.loading = True
        try:
            if self.on_loading is not None:
                await self.on_loading(True)
            yield
        finally:
            self.loading = False
        if self.on_loading is not None:  # not when cancelled: the node is stopping
            await self.on_loading(False)

    async def warm_up(self, holdings: Iterable[Holding]) -> None:
        """Run each of ``holdings`` the node still holds on its executor, off the event
        loop, twice, and take the second (warm) pass's time as a stage's (the injected
        delay included), so the node announces a latency it measured here. An idle
        replica would otherwise keep the cost model's cold penalty for good: the routers
        never send it traffic, so it is never measured, and load cannot move to it when
        the serving copy slows down. A whole-model executor is not warmed up: its pass
        would be a paid call to a provider. A pass that fails is logged at WARNING and
        leaves the node's latency as it was; it never raises."""
        if not self.runner.warms_up:
            return
        for holding in holdings:
            if self.draining() or holding not in self.held:
                continue  # a newer plan took it away
            model_id, start, end = holding
            try:
                # The first pass pays what only a first request would (weights paged in,
                # buffers allocated); the second is the one timed, so the figure is a warm
                # stage's, comparable with what real traffic measures afterwards.
                await self.runner.warm_pass(holding)
                spent = await self._measured_pass(holding)
            except Exception as exc:  # unmeasured, as before; never fatal to the node
                event(
                    self.log,
                    "warm-up failed",
                    logging.WARNING,
                    model_id=model_id,
                    layer_start=start,
                    layer_end=end,
                    error=repr(exc),
                )
                continue
            self.meter.warmed(spent)
            event(
                self.log,
                "warmed up",
                model_id=model_id,
                layer_start=start,
                layer_end=end,
                ms=round(spent / 1e6, 3),
            )

    async def remeasure(self) -> None:
        """An idle node measures itself again now and then: the latency it announces is
        otherwise the last one it measured, however long ago, and a node measured slow
        once (its warm-up on a machine busy starting the swarm) is never chosen, so never
        measured again. One warm pass per held range, every ``remeasure_s`` without
        traffic, and its figure replaces the old one: it is what a stage takes now."""
        if not self.runner.warms_up:
            return
        while True:
            await asyncio.sleep(self.remeasure_s)
            idle = self.meter.idle(self.remeasure_s)
            if self.draining() or not idle or self.meter.latency_ms is None:
                continue  # serving traffic measures it; no warm-up yet, nothing to redo
            for holding in dict.fromkeys(self.held):
                try:
                    spent = await self._measured_pass(holding)
                except Exception as exc:  # as a failed warm-up: logged, figure unchanged
                    event(self.log, "re-measure failed", logging.WARNING, error=repr(exc))
                    continue
                if not self.meter.idle(self.remeasure_s):
                    break  # traffic came meanwhile: its figure is the better one
                self.meter.remeasured(spent)

    async def _measured_pass(self, holding: Holding) -> int:
        """Nanoseconds of one warm pass over ``holding``, the injected delay included (a
        sick node measures as sick as it serves)."""
        started = time.perf_counter_ns()
        await self.slow_down()
        delayed = time.perf_counter_ns() - started
        return delayed + await self.runner.warm_pass(holding)
