"""node: hosts the layer ranges the plan gives it and executes them.

Listens: ``hecate.node.<id>.run`` (StageRequest, msgpack), ``hecate.node.roll-call``.
Computes: a generative model's steps in batches, on one compute thread
(:mod:`hecate.services.compute`), so that the event loop is always free to heartbeat.
Holds: the latest plan (KV watch) → the ranges it hosts, pre-loaded in its executor and
each run once on adoption (a timed warm-up pass).
Publishes: ``hecate.node.join`` on start and on roll-call, a heartbeat every interval
(stage latency as measured: none before the node has run anything, then its warm-up
passes refined by real stages; busy fraction, in-flight),
``hecate.node.leave`` when draining.
On SIGTERM it drains: no new work, in-flight work finishes, then it leaves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping

import msgspec
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError
from nats.js.kv import KeyValue
from opentelemetry.trace import TracerProvider

from hecate.bus import kv as kvs
from hecate.bus import tracing
from hecate.bus.logs import event
from hecate.bus.service import NO_RESPONDERS, Service, ServiceError, encode
from hecate.core.batching import MAX_BATCH
from hecate.core.plan import NodeProfile, SwarmPlan, executes
from hecate.core.telemetry import ewma
from hecate.executors import get_executor
from hecate.model.executor import Executor, ExecutorError, WarmsUp
from hecate.services.compute import Compute, Waiting
from hecate.wire import subjects
from hecate.wire.errors import as_code
from hecate.wire.messages import (
    FaultAck,
    Heartbeat,
    NodeFault,
    NodeJoin,
    NodeLeave,
    SessionRelease,
    StageReply,
    StageRequest,
)

_plan = msgspec.json.Decoder(SwarmPlan)

Holding = tuple[str, int, int]  # (model, start, end) from the plan
# Sessions released by their router, remembered so that a step of one still on its way
# (chained from the previous node) is refused instead of building its cache again.
REMEMBER_RELEASED = 4096


def _released(session: str) -> ExecutorError:
    return ExecutorError("cancelled", f"session {session!r} was released by its router")


def _timed(run: Callable[[str, int, int], None], holding: Holding) -> int:
    """Nanoseconds ``run`` takes on ``holding``, timed in the worker thread that runs it,
    so that the hand-off to the thread is not counted as compute."""
    started = time.perf_counter_ns()
    run(*holding)
    return time.perf_counter_ns() - started


class Node:
    def __init__(
        self,
        profile: NodeProfile,
        *,
        executor: str | Executor = "toy",
        heartbeat_s: float = 0.1,
        log: logging.Logger,
        tracer_provider: TracerProvider | None = None,
        accept_faults: bool = False,
        remeasure_s: float = 5.0,
    ) -> None:
        self.accept_faults = accept_faults
        self.fault = NodeFault()  # healthy
        self.executor: Executor = get_executor(executor) if isinstance(executor, str) else executor
        self.executor_name = self.executor.name
        # The profile the node joins with says what it runs, as its join always did.
        self.profile = msgspec.structs.replace(profile, executor=self.executor_name)
        self.heartbeat_s = heartbeat_s
        self.log = log
        self.service = Service(
            kind="node",
            name=subjects.SERVICE_NAMES["node"],
            instance_id=profile.node_id,
            description="executes the layer ranges the plan assigns to this node",
            log=log,
            tracer_provider=tracer_provider,
            metadata={
                "capacity_layers": str(profile.capacity_layers),
                "executor": self.executor_name,
            },
        )
        self.epoch = 0
        self.holdings: list[Holding] = []
        self._warmed: set[Holding] = set()  # holdings whose warm-up has been started
        self._preparing = asyncio.Lock()  # one plan's loading and warm-up at a time, in order
        self.draining = False
        self.in_flight = 0
        self._busy_ns = 0
        self._latency_ms: float | None = None
        self._worked_at = 0.0  # monotonic time of the last stage really served
        self._batches = self._batched_steps = self._largest_batch = 0
        self.remeasure_s = remeasure_s
        self._seq = 0
        self._relay_prefix = ""
        self._kv: KeyValue | None = None  # the plan bucket, once it exists
        self.compute: Compute | None = None
        self.released: OrderedDict[str, None] = OrderedDict()
        if getattr(self.executor, "generative", False):
            self.compute = Compute(
                getattr(self.executor, "step_batch"),  # noqa: B009 (generative)
                rows=getattr(self.executor, "rows", lambda _req: None),
                prefill_rows=lambda: int(getattr(self.executor, "prefill_chunk", 1)),
                on_batch=self._batched,
            )

    @property
    def latency_ms(self) -> float | None:
        """The stage latency the next heartbeat reports: ``None`` until a range has run."""
        return self._latency_ms

    # -- lifecycle ---------------------------------------------------------------------

    async def run(self, url: str, stop: asyncio.Event, grace: float = 10.0) -> None:
        svc = self.service
        await svc.start(url)
        limit_payload = getattr(self.executor, "limit_payload", None)
        if callable(limit_payload):  # prompts are run in chunks whose activations fit
            limit_payload(svc.nc.max_payload)
        svc.spawn(self._follow_plan())  # once the planner has created the plan bucket
        run = await svc.add_endpoint(
            "run",
            subjects.node_run(self.profile.node_id),
            StageRequest,
            self.execute,
            codec="msgpack",
            # A generative node serves steps side by side, so that those arriving while
            # a batch computes wait together and run as the next batch (one at a time,
            # every step would run alone); bounded: past it the subscription waits. The
            # others compute inline in microseconds, where a task per message would
            # cost more than the work.
            concurrency=MAX_BATCH * 4 if self.compute is not None else 1,
        )
        run.status = self._status
        await svc.add_raw("roll-call", subjects.NODE_ROLL_CALL, self._on_roll_call)
        await svc.add_endpoint(
            "release",
            subjects.node_release(self.profile.node_id),
            SessionRelease,
            self._on_release,
            traced=False,
        )
        if self.accept_faults:
            await svc.add_endpoint(
                "fault", subjects.node_fault(self.profile.node_id), NodeFault, self._on_fault
            )
        # Chained routes: NATS sends a no-responders status only to a subscription of the
        # connection that published, so forwards carry this node's relay subject as their
        # reply; what comes back on it (errors, no-responders) goes on to the router.
        self._relay_prefix = svc.nc.new_inbox()
        await svc.nc.subscribe(f"{self._relay_prefix}.>", cb=self._relay)
        await svc.ready()
        await self._join()
        beat = svc.spawn(self._heartbeats())
        svc.spawn(self._remeasure())
        event(
            self.log,
            "node ready",
            node_id=self.profile.node_id,
            capacity_layers=self.profile.capacity_layers,
        )
        await stop.wait()
        self.draining = True
        event(self.log, "draining", in_flight=self.in_flight)
        await self._heartbeat()  # tell telemetry before the last work finishes
        await svc.nc.publish(subjects.NODE_LEAVE, encode(NodeLeave(node_id=self.profile.node_id)))
        beat.cancel()
        await svc.stop(grace)
        if self.compute is not None:
            self.compute.close()
        event(self.log, "stopped")

    async def _join(self) -> None:
        join = NodeJoin(profile=self.profile, executor=self.executor_name)
        await self.service.nc.publish(subjects.NODE_JOIN, encode(join))

    async def _on_roll_call(self, _msg: object) -> None:
        if not self.draining:
            await self._join()

    # -- plan --------------------------------------------------------------------------

    async def _follow_plan(self) -> None:
        self._kv = await kvs.wait_bucket(self.service.nc, subjects.PLAN_BUCKET)
        async for value, revision in kvs.watch(self._kv, subjects.PLAN_KEY):
            if value is not None:
                self._adopt(_plan.decode(value), revision)

    def _adopt(self, plan: SwarmPlan, revision: int) -> None:
        me = self.profile.node_id
        self.epoch = revision
        given = [
            (p.model_id, s.layer_start, s.layer_end)
            for p in plan.pipelines
            for s in p.stages
            if s.node_id == me
        ]
        # The planner never does this; a plan written by hand or by a stale planner
        # might, and a range is better refused (``not_hosted``) than served by another
        # network under the model's name.
        refused = {
            spec.model_id: spec.executor
            for m, _a, _b in given
            if (spec := plan.model(m)) is not None and not executes(self.executor_name, spec)
        }
        for model_id, executor in sorted(refused.items()):
            event(
                self.log,
                "ranges refused: the model needs another executor",
                logging.ERROR,
                model_id=model_id,
                executor=executor,
                node_executor=self.executor_name,
            )
        self.holdings = [h for h in given if h[0] not in refused]
        event(self.log, "plan adopted", epoch=revision, holdings=self.holdings)
        fresh = [h for h in dict.fromkeys(self.holdings) if h not in self._warmed]
        self._warmed = {h for h in self._warmed if h in self.holdings} | set(fresh)
        self.service.spawn(self._prepare(fresh))

    async def _prepare(self, fresh: list[Holding]) -> None:
        """Load the held ranges now, off the event loop, not at first use; then warm up
        the ones this plan newly gives the node. Requests are served meanwhile."""
        async with self._preparing:
            prepare = getattr(self.executor, "prepare", None)
            if callable(prepare):
                try:
                    await asyncio.to_thread(prepare, [(a, b) for _m, a, b in self.holdings])
                except Exception as exc:  # a stage loads its range itself, or says why not
                    event(self.log, "prepare failed", logging.WARNING, error=repr(exc))
                    return
            await self.warm_up(fresh)

    async def warm_up(self, holdings: Iterable[Holding]) -> None:
        """Run each of ``holdings`` the node still holds on its executor, in a worker
        thread, twice, and take the second (warm) pass's time as a stage's (the injected
        delay included), so the node announces a latency it measured here. An idle
        replica would otherwise keep the cost model's cold penalty for good: the routers
        never send it traffic, so it is never measured, and load cannot move to it when
        the serving copy slows down. A whole-model executor is not warmed up: its pass
        would be a paid call to a provider. A pass that fails is logged at WARNING and
        leaves the node's latency as it was; it never raises."""
        if getattr(self.executor, "whole_model", False) or not isinstance(self.executor, WarmsUp):
            return
        for holding in holdings:
            if self.draining or holding not in self.holdings:
                continue  # a newer plan took it away
            model_id, start, end = holding
            try:
                # The first pass pays what only a first request would (weights paged in,
                # buffers allocated); the second is the one timed, so the figure is a warm
                # stage's, comparable with what real traffic measures afterwards.
                await self._offload(self.executor.warm_up, holding)
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
            self._busy_ns += spent
            self._latency_ms = ewma(self._latency_ms, spent / 1e6, 0.3)
            event(
                self.log,
                "warmed up",
                model_id=model_id,
                layer_start=start,
                layer_end=end,
                ms=round(spent / 1e6, 3),
            )

    async def _remeasure(self) -> None:
        """An idle node measures itself again now and then: the latency it announces is
        otherwise the last one it measured, however long ago, and a node measured slow
        once (its warm-up on a machine busy starting the swarm) is never chosen, so never
        measured again. One warm pass per held range, every ``remeasure_s`` without
        traffic, and its figure replaces the old one: it is what a stage takes now."""
        if getattr(self.executor, "whole_model", False) or not isinstance(self.executor, WarmsUp):
            return
        while True:
            await asyncio.sleep(self.remeasure_s)
            idle = time.monotonic() - self._worked_at >= self.remeasure_s
            if self.draining or not idle or self._latency_ms is None:
                continue  # serving traffic measures it; no warm-up yet, nothing to redo
            for holding in dict.fromkeys(self.holdings):
                try:
                    spent = await self._measured_pass(holding)
                except Exception as exc:  # as a failed warm-up: logged, figure unchanged
                    event(self.log, "re-measure failed", logging.WARNING, error=repr(exc))
                    continue
                if time.monotonic() - self._worked_at < self.remeasure_s:
                    break  # traffic came meanwhile: its figure is the better one
                self._busy_ns += spent
                self._latency_ms = spent / 1e6

    async def _measured_pass(self, holding: Holding) -> int:
        """Nanoseconds of one warm pass over ``holding``, the injected delay included (a
        sick node measures as sick as it serves)."""
        assert isinstance(self.executor, WarmsUp)
        started = time.perf_counter_ns()
        await self._injected_delay()
        delayed = time.perf_counter_ns() - started
        return delayed + await self._offload(self.executor.warm_up, holding)

    async def _offload(self, run: Callable[[str, int, int], None], holding: Holding) -> int:
        """``_timed(run, holding)`` off the event loop: on the compute thread of a
        generative executor (between its batches, never beside one), on a worker
        thread otherwise."""
        if self.compute is not None:
            return await self.compute.offload(_timed, run, holding)
        return await asyncio.to_thread(_timed, run, holding)

    def _hosts(self, model_id: str, start: int, end: int) -> bool:
        return any(m == model_id and a <= start and end <= b for m, a, b in self.holdings)

    # -- work --------------------------------------------------------------------------

    async def _on_fault(self, fault: NodeFault, _headers: Mapping[str, str]) -> FaultAck:
        self.fault = fault
        event(self.log, "fault injected", logging.WARNING, fault=msgspec.to_builtins(fault))
        return FaultAck(node_id=self.profile.node_id)

    async def _injected_delay(self) -> None:
        """An injected slowdown, awaited inside the stage timer: telemetry must see the
        node exactly as it would see one whose hardware is that slow (measured latency,
        busy time and work in flight all rise), or load would never move off it."""
        if self.fault.delay_ms:
            # uvloop's timers run on a millisecond clock read once per loop turn, so a
            # single sleep can end up to a millisecond early; the fault promises at least
            # the delay, as the stage timer measures it.
            deadline = time.perf_counter() + self.fault.delay_ms / 1000
            while (left := deadline - time.perf_counter()) > 0:
                await asyncio.sleep(left)

    async def execute(self, req: StageRequest, headers: Mapping[str, str]) -> StageReply | None:
        if self.fault.error:
            raise ServiceError(
                as_code(self.fault.error), "injected fault", self.fault.retry_after_s
            )
        reply = await self._execute(req, headers)
        if reply is not None and req.reply_base:
            # A chained stage answers the router itself: its own reply subject is the
            # previous node's relay, which only carries failures back.
            await self.service.nc.publish(
                f"{req.reply_base}-{req.stage_index}", encode(reply, "msgpack")
            )
            return None
        return reply

    async def _relay(self, msg: Msg) -> None:
        """A failure answering one of our forwards: pass it to the router's subject for
        that stage, a no-responders status as the explicit ``no_responders`` error."""
        target = msg.subject[len(self._relay_prefix) + 1 :]
        try:
            if msg.headers and msg.headers.get("Status") == NO_RESPONDERS:
                stage = target.rsplit("-", 1)[-1]
                await self.service.reply_error(
                    target, "no_responders", f"no node took chained stage {stage}", "msgpack"
                )
            else:
                await self.service.nc.publish(target, msg.data, headers=msg.headers)
        except Exception as exc:  # disconnected: the router's stage timeout covers it
            event(self.log, "relay failed", logging.WARNING, error=repr(exc))

    async def _execute(self, req: StageRequest, _headers: Mapping[str, str]) -> StageReply | None:
        if self.draining:
            raise ServiceError("draining", f"node {self.profile.node_id} is draining")
        if not self._hosts(req.model_id, req.layer_start, req.layer_end):
            if req.epoch > self.epoch and self._kv is not None:  # a newer plan: catch up
                entry = await self._kv.get(subjects.PLAN_KEY)
                if entry.value:
                    self._adopt(_plan.decode(entry.value), int(entry.revision or 0))
            if not self._hosts(req.model_id, req.layer_start, req.layer_end):
                raise ServiceError(
                    "not_hosted",
                    f"node {self.profile.node_id} does not host {req.model_id} "
                    f"[{req.layer_start}, {req.layer_end}) in plan epoch {self.epoch}",
                )
        if getattr(self.executor, "whole_model", False):
            return await self._whole(req)
        if getattr(self.executor, "generative", False):
            return await self._generate(req)
        self.in_flight += 1
        started = time.perf_counter_ns()
        try:
            await self._injected_delay()
            # The toy executor takes microseconds; a heavy executor would run in a thread.
            x = req.activation
            if req.layer_start == 0 and not x:
                x = self.executor.embed(req.model_id, req.prompt)
            x = self.executor.run(req.model_id, req.layer_start, req.layer_end, x)
            output = None
            if req.decode_tokens is not None and not req.chain:
                output = self.executor.decode(req.model_id, req.model_layers, x, req.decode_tokens)
        except ExecutorError as exc:
            raise ServiceError(exc.code, exc.message) from None
        finally:
            spent = time.perf_counter_ns() - started
            self._busy_ns += spent
            self.in_flight -= 1
        ms = spent / 1e6
        self._latency_ms = ewma(self._latency_ms, ms, 0.3)
        self._worked_at = time.monotonic()
        if req.chain:
            await self._forward(req, x)
            return None  # the next stage (in the end, the last one) answers the router
        return StageReply(
            ok=True, activation=x if output is None else b"", output=output, compute_ms=ms
        )

    async def _on_release(self, release: SessionRelease, _headers: Mapping[str, str]) -> None:
        """The router is done with a session: its steps still waiting here are refused,
        later ones too, and its caches are dropped on the compute thread between two
        batches (never under a batch that uses them)."""
        if self.compute is None:
            return
        self.released[release.session] = None
        while len(self.released) > REMEMBER_RELEASED:
            self.released.popitem(last=False)
        self.compute.refuse(release.session, _released(release.session))
        drop = getattr(self.executor, "release", None)
        if callable(drop):
            await self.compute.offload(drop, release.session)

    async def _generate(self, req: StageRequest) -> StageReply | None:
        """One generation step of a real model, run in a batch with every other step
        waiting on this node (:mod:`hecate.services.compute`), never on the event loop:
        heartbeats and the bus keep flowing however long compute takes. Chained, the
        step's hidden state goes straight to the next stage.

        In flight counts the step from its arrival to its answer (queued or computing);
        an injected slowdown is waited out before the step joins the queue."""
        assert self.compute is not None
        if req.session in self.released:
            raise ServiceError(_released(req.session).code, _released(req.session).message)
        self.in_flight += 1
        try:
            started = time.perf_counter_ns()
            await self._injected_delay()
            reply = await self.compute.step(req, time.perf_counter_ns() - started)
        except ExecutorError as exc:
            raise ServiceError(exc.code, exc.message) from None
        finally:
            self.in_flight -= 1
        prompt_tokens = reply.prompt_tokens or req.prompt_tokens
        if req.chain:
            await self._forward(req, reply.activation, prompt_tokens)
            return None
        if prompt_tokens is not reply.prompt_tokens:
            reply = msgspec.structs.replace(reply, prompt_tokens=prompt_tokens)
        return reply

    def _status(self) -> dict[str, object]:
        """What ``$SRV.STATS`` shows of the node's work: in flight, its stage latency, and
        how its generation steps were batched."""
        return {
            "in_flight": self.in_flight,
            "latency_ms": self._latency_ms,
            "batches": self._batches,
            "batched_steps": self._batched_steps,
            "largest_batch": self._largest_batch,
            "sessions": int(getattr(self.executor, "session_count", lambda: 0)()),
        }

    def _batched(self, spent_ns: int, batch: list[Waiting]) -> None:
        """A batch's account: busy for as long as it computed, and one stage latency
        sample per batch, what each of its steps waited for this stage to compute it
        (queueing behind a batch is load, reported as in flight, not speed). An
        injected slowdown counts as if the hardware were that much slower: once per
        batch, as a slower machine would take that much longer for each batch."""
        delayed = max(w.delay_ns for w in batch)
        self._batches += 1
        self._batched_steps += len(batch)
        self._largest_batch = max(self._largest_batch, len(batch))
        self._busy_ns += spent_ns + delayed
        self._latency_ms = ewma(self._latency_ms, (spent_ns + delayed) / 1e6, 0.3)
        self._worked_at = time.monotonic()

    async def _whole(self, req: StageRequest) -> StageReply:
        """An executor that serves the whole model at once (an upstream provider)."""
        from hecate.services.upstream import UpstreamRefused

        if req.layer_start != 0 or req.layer_end != req.model_layers or req.chain:
            raise ServiceError("bad_range", f"{self.executor.name} serves whole requests only")
        complete = getattr(self.executor, "complete")  # noqa: B009 (checked by whole_model)
        self.in_flight += 1
        started = time.perf_counter_ns()
        try:
            await self._injected_delay()
            output = await complete(req.prompt, req.decode_tokens or 16)
        except UpstreamRefused as exc:
            raise ServiceError(exc.code, exc.message, exc.retry_after_s) from None
        finally:
            self.in_flight -= 1
            spent = time.perf_counter_ns() - started
            self._busy_ns += spent
        ms = spent / 1e6
        self._latency_ms = ewma(self._latency_ms, ms, 0.3)
        self._worked_at = time.monotonic()
        return StageReply(ok=True, output=str(output), compute_ms=ms)

    async def _forward(
        self, req: StageRequest, activation: bytes, prompt_tokens: list[int] | None = None
    ) -> None:
        """Send the next stage of a chained route, replying-to the router's inbox token
        for that stage: if the next node is gone, NATS tells the router directly. A
        generation step carries its session, position and sampling along."""
        nxt, rest = req.chain[0], req.chain[1:]
        forward = msgspec.structs.replace(
            req,
            layer_start=nxt.layer_start,
            layer_end=nxt.layer_end,
            activation=activation,
            chain=rest,
            stage_index=req.stage_index + 1,
            prompt_tokens=prompt_tokens,
            # The first stage's inputs stop here: later stages take the activation.
            prompt="",
            tokens=None,
            messages=None,
        )
        headers = tracing.inject({}) if self.service.tracing else None
        body = encode(forward, "msgpack")
        try:
            await self.service.nc.publish(
                subjects.node_run(nxt.node_id),
                body,
                reply=f"{self._relay_prefix}.{req.reply_base}-{req.stage_index + 1}",
                headers=headers,
            )
        except MaxPayloadError:  # the activation outgrew the bus: no node is at fault
            raise ServiceError(
                "payload_too_large",
                f"the activation for {nxt.node_id} is {len(body):,} bytes, over the bus's "
                f"max_payload of {self.service.nc.max_payload:,}: the prompt is too long for "
                "this swarm",
            ) from None
        except Exception as exc:
            raise ServiceError(
                "forward_failed", f"could not forward to {nxt.node_id}: {exc!r}"
            ) from None

    # -- heartbeats --------------------------------------------------------------------

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            await self._heartbeat()

    async def _heartbeat(self) -> None:
        self._seq += 1
        busy, self._busy_ns = self._busy_ns, 0
        beat = Heartbeat(
            node_id=self.profile.node_id,
            seq=self._seq,
            sent_at=time.time(),
            interval_ms=self.heartbeat_s * 1000,
            # Nothing until a range has really run here (a warm-up pass or a stage):
            # the declared figure sent as if measured would lift the cost model's
            # penalty on an unmeasured node.
            latency_ms=self.latency_ms,
            load=min(1.0, busy / (self.heartbeat_s * 1e9)),
            in_flight=self.in_flight,
            score=self.profile.score,
            draining=self.draining,
        )
        try:
            await self.service.nc.publish(subjects.heartbeat(self.profile.node_id), encode(beat))
        except Exception as exc:  # reconnecting: the next beat will go out
            event(self.log, "heartbeat not sent", logging.DEBUG, error=repr(exc))
