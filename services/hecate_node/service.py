"""node: hosts the layer ranges the plan gives it and executes them.

Listens: ``hecate.node.<id>.run`` (a stage: ``LayersStage``, ``StepStage`` or
``WholeStage``, msgpack), ``hecate.node.roll-call``, ``hecate.node.<id>.release`` (a
router done with a session), and with ``accept_faults`` ``hecate.node.<id>.fault``;
a chained stage's forward and the relay of its failures: :mod:`.chain`.
Computes: through one path (:meth:`Node.execute`) and one timer, whatever its
executor's kind (:mod:`hecate_node.executor`): a generative model's steps in
batches on one compute thread (:mod:`hecate_node.compute`), so that the event loop
is always free to heartbeat.
Holds: the latest plan (KV watch) → the ranges it hosts, pre-loaded in its executor and
each run once on adoption (a timed warm-up pass; :mod:`hecate_node.holdings`).
Publishes, on subjects naming its own id (on a locked-down bus its user may use no
other): ``hecate.node.<id>.join`` on start and on roll-call, a heartbeat every interval
(stage latency as measured: none before the node has run anything, then its warm-up
passes refined by real stages; busy fraction, in-flight; :mod:`.meter`; whether it
is loading ranges, with one beat more as a load starts, flushed, and one as it ends: a
loader holding the interpreter, as SmolLM2's tokenizer build does, holds the beats too,
and telemetry gives a node that said it is loading a load's allowance, not its pace's),
``hecate.node.<id>.leave`` when draining.
On SIGTERM it drains: no new work, in-flight work finishes, then it leaves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import cast

import msgspec
from opentelemetry.trace import TracerProvider

from hecate.bus.logs import event
from hecate.bus.service import Service, ServiceError, encode
from hecate.core.errors import HecateError
from hecate.core.telemetry import beat_interval
from hecate.executors import checked, get_executor
from hecate.model.executor import Executor, ExecutorError
from hecate.model.footprint import Range, Refusal
from hecate.wire import subjects
from hecate.wire.errors import as_code
from hecate.wire.messages import FaultAck, Heartbeat, NodeFault, NodeJoin, NodeLeave, SessionRelease
from hecate.wire.stages import StageReply, StageRequest
from hecate_node.batching import MAX_BATCH
from hecate_node.chain import Chain, ahead
from hecate_node.config import NodeConfig
from hecate_node.executor import runner_for
from hecate_node.holdings import Holdings
from hecate_node.kept import PACE_S, Teller
from hecate_node.memory import in_use
from hecate_node.meter import StageMeter, slow_down
from hecate_node.room import memory_status, weigh

# How long a load waits for the beat that announces it: a round trip on a live link.
LOADING_FLUSH_S = 1.0
# nats-py's own wait for that PONG, never reached on a live link: a flush that times out
# or is cancelled leaves its PONG to fail the connection's reader when it comes.
PONG_TIMEOUT_S = 120


def _quietly(task: asyncio.Future[None]) -> None:
    """A PING of a connection that closed raises: that is not news here."""
    if not task.cancelled():
        task.exception()


class Node:
    def __init__(
        self,
        config: NodeConfig,
        *,
        log: logging.Logger,
        tracer_provider: TracerProvider | None = None,
        executor: Executor | None = None,
    ) -> None:
        """``executor`` is an executor built by the caller (one that needs arguments,
        an upstream provider); otherwise ``config.executor`` is looked up by name. A
        name and an object that disagree, or an object that is not an executor of the
        kind it declares, raise ``unknown_executor`` here, before the node starts."""
        if executor is None:
            executor = get_executor(config.executor)
        else:
            executor = checked(executor, config.executor)
        self.config = config
        self.executor = executor
        # Joined with what its executor declares it is: the plan carries it to routers.
        self.profile = msgspec.structs.replace(config.joined(), kind=executor.kind)
        self.log = log
        self.fault = NodeFault()  # healthy
        self.draining = False
        self.meter = StageMeter()
        self.runner = runner_for(executor, self.meter, MAX_BATCH)
        self.service = Service(
            kind="node",
            name=subjects.SERVICE_NAMES["node"],
            instance_id=self.profile.node_id,
            description="executes the layer ranges the plan assigns to this node",
            log=log,
            tracer_provider=tracer_provider,
            metadata={
                "capacity_layers": str(self.profile.capacity_layers),
                "executor": config.executor,
            },
        )
        self.holdings = Holdings(
            self.profile.node_id,
            config.executor,
            self.runner,
            self.meter,
            log=log,
            spawn=self.service.spawn,
            slow_down=self._slow_down,
            draining=lambda: self.draining,
            remeasure_s=config.remeasure_s,
        )
        self.holdings.on_loading = self._announce_loading
        self.holdings.on_refused = self._refused
        self.chain = Chain(self.service, log)
        self.teller = Teller.of(self.profile.node_id, self.runner, self.meter, log, PACE_S)
        self._seq = 0
        self._beat_s = config.heartbeat_s  # the pace the last beat declared
        self._beating = False  # beats go out once the node has joined
        self._announced: asyncio.Future[None] | None = None  # the PING after a loading beat

    @property
    def latency_ms(self) -> float | None:
        """The stage latency the next heartbeat reports: ``None`` until a range has run."""
        return self.meter.latency_ms

    # -- lifecycle ---------------------------------------------------------------------

    async def run(self, url: str, stop: asyncio.Event, grace: float = 10.0) -> None:
        svc = self.service
        node_id = self.profile.node_id
        await self._weigh()
        await svc.start(url)
        self.runner.limit_payload(svc.nc.max_payload)
        for loop in self.runner.loops():  # the compute loop, for one: never unsupervised
            svc.spawn(loop)
        svc.spawn(self.holdings.follow(svc.nc))
        run = await svc.add_endpoint(
            "run",
            subjects.node_run(node_id),
            # A tagged union: its variant says what the stage carries.
            cast("type[StageRequest]", StageRequest),
            self.execute,
            codec="msgpack",
            concurrency=self.runner.concurrency,
        )
        run.status = self._status
        # Any JSON body (the planner sends {}): a roll-call carries nothing but itself.
        await svc.add_endpoint(
            "roll-call", subjects.NODE_ROLL_CALL, msgspec.Raw, self._on_roll_call, traced=False
        )
        await svc.add_endpoint(
            "release",
            subjects.node_release(node_id),
            SessionRelease,
            self._on_release,
            traced=False,
        )
        if self.teller is not None:  # what its first stages keep, for every router
            await self.teller.start(svc)
        if self.config.accept_faults:
            await svc.add_endpoint("fault", subjects.node_fault(node_id), NodeFault, self._on_fault)
        await self.chain.start()  # chained routes: forwards and their failures' relay
        await svc.ready()
        await self._join()
        self._beating = True
        beat = svc.spawn(self._heartbeats())
        svc.spawn(self.holdings.remeasure())
        event(self.log, "node ready", node_id=node_id, capacity_layers=self.profile.capacity_layers)
        await stop.wait()
        self.draining = True
        event(self.log, "draining", in_flight=self.meter.in_flight)
        await self._heartbeat()  # tell telemetry before the last work finishes
        await svc.nc.publish(subjects.node_leave(node_id), encode(NodeLeave(node_id=node_id)))
        beat.cancel()
        await svc.stop(grace)
        self.runner.close()
        event(self.log, "stopped")

    async def _weigh(self) -> None:
        """Weigh the model against the node's memory (:mod:`hecate_node.room`) before
        joining: the profile says the memory, a layer's bytes and, unless the operator
        gave it, how many layers fit; the holdings refuse ranges that do not."""
        room = await asyncio.to_thread(weigh, self.executor, self.config.memory)
        if room is None:
            if self.config.capacity_from_memory:
                raise HecateError(
                    f"executor {self.config.executor} cannot say what its layers cost in "
                    "memory: give --capacity-layers"
                )
            return
        capacity = room.fit if self.config.capacity_from_memory else self.profile.capacity_layers
        self.profile = msgspec.structs.replace(
            self.profile,
            capacity_layers=capacity,
            memory_bytes=room.memory.limit,
            memory_from=room.memory.source,
            layer_bytes=room.footprint.layer_bytes(),
        )
        self.service.metadata["capacity_layers"] = str(capacity)
        self.holdings.room = room
        event(
            self.log,
            "memory weighed",
            memory=room.memory.limit,
            memory_from=room.memory.source,
            budget=room.budget,
            layer_bytes=room.footprint.layer_bytes(),
            fit=room.fit,
            capacity_layers=capacity,
        )

    async def _refused(self, refusal: Refusal, kept: list[Range]) -> None:
        """A plan gave more than fits: join again with the capacity that does, so that
        the planner plans around this node."""
        room = self.holdings.room
        assert room is not None  # only a node that weighed its model refuses
        capacity = room.capacity_after(self.profile.capacity_layers, kept)
        if capacity == self.profile.capacity_layers or self.draining:
            return
        self.profile = msgspec.structs.replace(self.profile, capacity_layers=capacity)
        event(
            self.log,
            "capacity lowered",
            logging.WARNING,
            capacity_layers=capacity,
            refused=str(refusal),
        )
        await self._join()

    async def _join(self) -> None:
        join = NodeJoin(profile=self.profile, executor=self.config.executor)
        await self.service.nc.publish(subjects.node_join(self.profile.node_id), encode(join))

    async def _on_roll_call(self, _body: msgspec.Raw, _headers: Mapping[str, str]) -> None:
        if not self.draining:
            await self._join()

    # -- work --------------------------------------------------------------------------

    async def execute(self, req: StageRequest, _headers: Mapping[str, str]) -> StageReply | None:
        """Serve one stage: refuse it (injected fault, draining, not hosted), or run it
        on the executor, timed, then answer it, or forward it down its chain."""
        if self.fault.error:
            raise ServiceError(
                as_code(self.fault.error), "injected fault", self.fault.retry_after_s
            )
        if self.draining:
            raise ServiceError("draining", f"node {self.profile.node_id} is draining")
        await self._check_hosted(req)
        reply = await self._run(req)
        while (after := ahead(req, reply)) is not None:
            # A long sequence's first stage runs ahead: this chunk goes down the chain
            # now, and the stages after compute it while this one runs the next.
            await self.chain.pass_on(msgspec.structs.replace(req, more=True), reply)
            req = after
            with self.service.tracer.start_as_current_span(
                "node chunk ahead", attributes={"hecate.position": after.position}
            ):
                reply = await self._run(req)
        return await self.chain.pass_on(req, reply)

    async def _run(self, req: StageRequest) -> StageReply:
        """``req`` run on the executor, timed."""
        meter, runner = self.meter, self.runner
        meter.in_flight += 1  # from its arrival to its answer, queued or computing
        started = time.perf_counter_ns()
        ok = False
        try:
            await self._slow_down()
            reply = await runner.run(req, time.perf_counter_ns() - started)
            ok = True
        except ExecutorError as exc:
            raise ServiceError(exc.code, exc.message, exc.retry_after_s) from None
        finally:
            meter.in_flight -= 1
            spent = time.perf_counter_ns() - started
            if runner.per_stage:
                meter.stage(spent, ok)
        if runner.per_stage:
            reply = msgspec.structs.replace(reply, compute_ms=spent / 1e6)
        return reply

    async def _check_hosted(self, req: StageRequest) -> None:
        held = self.holdings
        if held.hosts(req.model_id, req.layer_start, req.layer_end):
            return
        await held.catch_up(req.epoch)
        if not held.hosts(req.model_id, req.layer_start, req.layer_end):
            raise ServiceError(
                "not_hosted",
                f"node {self.profile.node_id} does not host {req.model_id} "
                f"[{req.layer_start}, {req.layer_end}) in plan epoch {held.epoch}",
            )

    async def _slow_down(self) -> None:
        await slow_down(self.fault.delay_ms)

    async def _on_fault(self, fault: NodeFault, _headers: Mapping[str, str]) -> FaultAck:
        self.fault = fault
        event(self.log, "fault injected", logging.WARNING, fault=msgspec.to_builtins(fault))
        return FaultAck(node_id=self.profile.node_id)

    async def _on_release(self, release: SessionRelease, _headers: Mapping[str, str]) -> None:
        """The router is done with a session: its executor lets go of it."""
        await self.runner.release(release.session)

    def _status(self) -> dict[str, object]:
        """What ``$SRV.STATS`` shows of the node's work: in flight, its stage latency, and
        how its generation steps were batched."""
        meter = self.meter
        return {
            "in_flight": meter.in_flight,
            "latency_ms": meter.latency_ms,
            "batches": meter.batches,
            "batched_steps": meter.batched_steps,
            "largest_batch": meter.largest_batch,
            "sessions": self.runner.sessions(),
            "prefixes": self.runner.prefixes(),
            "kept": self.teller.status() if self.teller is not None else {},
            "engine": self.runner.engine(),
            "bad_plans": self.holdings.bad_plans,
            "memory": memory_status(self.holdings.room),
        }

    # -- heartbeats --------------------------------------------------------------------

    @property
    def beat_s(self) -> float:
        """How often this node beats now: its configured pace, slower in a swarm whose
        beats would pass their budget (``hecate.core.telemetry.beat_interval``). Each beat
        declares it, so telemetry judges the silence after it by it."""
        c = self.config
        return beat_interval(
            c.heartbeat_s, self.holdings.swarm_nodes, c.heartbeat_budget_per_s, c.heartbeat_most_s
        )

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self._beat_s)  # what the last beat declared
            await self._heartbeat()

    async def _announce_loading(self, loading: bool) -> None:
        """A load starts or ends: say so now. As it starts, see the beat off before the
        loader can hold the interpreter (telemetry would otherwise hear nothing until it
        lets go, and judge that silence by the node's 100 ms pace); as it ends, so that
        the node is judged at its pace again at once, not a beat later. Before the node
        has joined it is not beating yet: its first beat will say it is loading. The
        PING that sees the beat off waits in a task of its own, never cancelled (nor
        timed out by nats-py), and the load waits for it at most ``LOADING_FLUSH_S``:
        reconnecting, the load goes on and its beats say it."""
        if not self._beating or self.draining:
            return
        await self._heartbeat()
        if not loading:
            return
        announced = asyncio.ensure_future(self.service.nc.flush(timeout=PONG_TIMEOUT_S))
        announced.add_done_callback(_quietly)
        self._announced = announced
        await asyncio.wait({announced}, timeout=LOADING_FLUSH_S)

    async def _heartbeat(self) -> None:
        self._seq += 1
        interval_s = self._beat_s = self.beat_s
        beat = Heartbeat(
            node_id=self.profile.node_id,
            seq=self._seq,
            sent_at=time.time(),
            interval_ms=interval_s * 1000,
            # Nothing until a range has really run here (a warm-up pass or a stage):
            # the declared figure sent as if measured would lift the cost model's
            # penalty on an unmeasured node.
            latency_ms=self.meter.latency_ms,
            load=min(1.0, self.meter.take_busy() / (interval_s * 1e9)),
            in_flight=self.meter.in_flight,
            score=self.profile.score,
            draining=self.draining,
            loading=self.holdings.loading,
            memory_used=in_use(),
        )
        try:
            await self.service.nc.publish(subjects.heartbeat(self.profile.node_id), encode(beat))
        except Exception as exc:  # reconnecting: the next beat will go out
            event(self.log, "heartbeat not sent", logging.DEBUG, error=repr(exc))
