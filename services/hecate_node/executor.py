"""How a node runs its executor: one adapter per kind, behind one interface.

The node serves every stage through :class:`Runner.run`, with one timer around it
(:mod:`hecate_node.meter`); the adapter takes the wire's stage variant its kind
is sent (:mod:`hecate.wire.stages`), turns it into the kind's typed input
(:mod:`hecate.model.executor`), runs it where that kind must run and turns the typed
output into the reply:

* ``layers`` (a ``LayersStage``): inline on the event loop (microseconds of numpy; a
  task or a thread per stage would cost more than the work); an activation, or the
  decoded text at a route's end;
* ``steps`` (a ``StepStage``): in a batch with every other step waiting, on the compute
  thread (:mod:`hecate_node.compute`), its time recorded per batch; an activation,
  or the sampled token at a route's end;
* ``whole`` (a ``WholeStage``): one awaited call covering every layer; the text.

A stage of another variant is refused (``bad_request``): its model is not this
executor's.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any, Protocol

from hecate.model.executor import (
    Executor,
    ExecutorError,
    ExecutorKind,
    LayerExecutor,
    LayerInput,
    StepExecutor,
    WholeExecutor,
)
from hecate.wire.stages import (
    ActivationReply,
    LayersStage,
    OutputReply,
    StageReply,
    StageRequest,
    StepStage,
    WholeStage,
)
from hecate_node.compute import Compute, Waiting
from hecate_node.convert import step_input, step_reply
from hecate_node.meter import StageMeter, timed

Holding = tuple[str, int, int]  # (model, start, end) from the plan
# Sessions released by their router, remembered so that a step of one still on its way
# (chained from the previous node) is refused instead of building its cache again.
REMEMBER_RELEASED = 4096


class Runner(Protocol):
    kind: ExecutorKind
    #: Timed by the node per stage (True) or by the runner per batch (False).
    per_stage: bool
    #: Whether its ranges are warmed up and re-measured (not a paid provider call).
    warms_up: bool
    #: How many stages it may serve at once (the endpoint's concurrency).
    concurrency: int

    async def run(self, req: StageRequest, delay_ns: int) -> StageReply:
        """The reply to ``req`` (``compute_ms`` left to the node when ``per_stage``);
        ``delay_ns`` is the injected slowdown already waited out. Raises
        :class:`ExecutorError`."""
        ...

    async def prepare(self, ranges: list[tuple[int, int]]) -> None:
        """Load the held ranges now, off the event loop, not at first use."""
        ...

    async def warm_pass(self, holding: Holding) -> int:
        """Nanoseconds of one warm-up pass over ``holding``, run off the event loop."""
        ...

    def limit_payload(self, max_payload: int) -> None: ...

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        """Its long-lived loops, for the node to run in its task group."""
        ...

    async def release(self, session: str) -> None: ...

    def sessions(self) -> int: ...

    def prefixes(self) -> dict[str, int]:
        """What the executor's cached prompt prefixes did (empty: it keeps none)."""
        ...

    def engine(self) -> dict[str, int]:
        """What the executor's engine computed (empty: it says nothing)."""
        ...

    def close(self) -> None: ...


class _Base:
    per_stage = True
    warms_up = True
    concurrency = 1

    async def prepare(self, ranges: list[tuple[int, int]]) -> None:
        del ranges

    def limit_payload(self, max_payload: int) -> None:
        del max_payload

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        return []

    async def release(self, session: str) -> None:
        del session

    def sessions(self) -> int:
        return 0

    def prefixes(self) -> dict[str, int]:
        return {}

    def engine(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass


class LayerRunner(_Base):
    kind: ExecutorKind = "layers"

    def __init__(self, executor: LayerExecutor) -> None:
        self.executor = executor

    async def run(self, req: StageRequest, delay_ns: int) -> StageReply:
        del delay_ns
        if not isinstance(req, LayersStage):
            raise _mismatch(self, req)
        out = self.executor.execute(
            LayerInput(
                model_id=req.model_id,
                layer_start=req.layer_start,
                layer_end=req.layer_end,
                model_layers=req.model_layers,
                activation=req.activation,
                prompt=req.prompt,
                # A chained stage hands its activation on; only a route's end decodes.
                decode_tokens=None if req.chain else req.decode_tokens,
            )
        )
        # The first stage counted the prompt; down a chain its count rides along.
        prompt_count = req.prompt_count if out.prompt_count is None else out.prompt_count
        if out.output is not None:
            return OutputReply(
                output=out.output,
                prompt_count=prompt_count,
                completion_count=out.completion_count,
            )
        return ActivationReply(activation=out.activation, prompt_count=prompt_count)

    async def warm_pass(self, holding: Holding) -> int:
        return await asyncio.to_thread(timed, self.executor.warm_up, holding)


class WholeRunner(_Base):
    kind: ExecutorKind = "whole"
    warms_up = False  # a pass would be a paid call to a provider

    def __init__(self, executor: WholeExecutor) -> None:
        self.executor = executor

    async def run(self, req: StageRequest, delay_ns: int) -> StageReply:
        del delay_ns
        if not isinstance(req, WholeStage):
            raise _mismatch(self, req)
        if req.layer_start != 0 or req.layer_end != req.model_layers or req.chain:
            raise ExecutorError("bad_range", f"{self.executor.name} serves whole requests only")
        output = await self.executor.complete(req.prompt, req.decode_tokens or 16)
        return OutputReply(output=str(output))

    async def warm_pass(self, holding: Holding) -> int:
        raise ExecutorError("bad_request", f"{self.executor.name} does not warm up {holding}")


class StepRunner(_Base):
    """Generation steps, batched on one compute thread. A released session's steps
    still waiting are refused, and later ones too."""

    kind: ExecutorKind = "steps"
    per_stage = False
    # Steps are served side by side, so that those arriving while a batch computes wait
    # together and run as the next batch (one at a time, every step would run alone);
    # bounded: past it the subscription waits.

    def __init__(self, executor: StepExecutor, meter: StageMeter, max_batch: int) -> None:
        self.executor = executor
        self.meter = meter
        self.concurrency = max_batch * 4
        self.released: OrderedDict[str, None] = OrderedDict()
        self.compute = Compute(
            executor.execute,
            rows=executor.rows,
            prefill_rows=lambda: int(executor.prefill_chunk),
            on_batch=self._batched,
            tokenize=executor.tokenize,
        )

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        return [self.compute.supervised()]

    async def run(self, req: StageRequest, delay_ns: int) -> StageReply:
        if not isinstance(req, StepStage):
            raise _mismatch(self, req)
        if req.session in self.released:
            raise _released(req.session)
        out = await self.compute.step(step_input(req), delay_ns)
        return step_reply(out, out.prompt_tokens or req.prompt_tokens, more=req.more)

    def _batched(self, spent_ns: int, batch: list[Waiting]) -> None:
        # An injected slowdown counts once per batch, as a slower machine would take
        # that much longer for each batch.
        ran = [(_ran(w), w.req.layer_end - w.req.layer_start) for w in batch]
        positions = sum(r for r, _ in ran)
        layers = max(n for r, n in ran if r) if positions else 0
        self.meter.batch(spent_ns + max(w.delay_ns for w in batch), len(batch), positions, layers)

    async def prepare(self, ranges: list[tuple[int, int]]) -> None:
        await asyncio.to_thread(self.executor.prepare, ranges)

    async def warm_pass(self, holding: Holding) -> int:
        # On the compute thread, between batches, never beside one.
        return await self.compute.offload(timed, self.executor.warm_up, holding)

    def limit_payload(self, max_payload: int) -> None:
        self.executor.limit_payload(max_payload)  # prompts run in chunks that fit

    async def release(self, session: str) -> None:
        """Refuse the session's waiting steps, then drop its caches on the compute
        thread between two batches (never under a batch that uses them)."""
        self.released[session] = None
        while len(self.released) > REMEMBER_RELEASED:
            self.released.popitem(last=False)
        self.compute.refuse(session, _released(session))
        await self.compute.offload(self.executor.release, session)

    def sessions(self) -> int:
        return self.executor.session_count()

    def prefixes(self) -> dict[str, int]:
        counts = getattr(self.executor, "prefix_counts", None)
        return counts() if callable(counts) else {}

    def engine(self) -> dict[str, int]:
        counts = getattr(self.executor, "engine_counts", None)
        return counts() if callable(counts) else {}

    def close(self) -> None:
        self.compute.close()


def runner_for(executor: Executor, meter: StageMeter, max_batch: int) -> Runner:
    """The adapter for the kind ``executor`` declares (the registry has checked it
    implements that kind's protocol)."""
    kind = executor.kind
    if kind == "layers":
        assert isinstance(executor, LayerExecutor)
        return LayerRunner(executor)
    if kind == "steps":
        assert isinstance(executor, StepExecutor)
        return StepRunner(executor, meter, max_batch)
    assert isinstance(executor, WholeExecutor)
    return WholeRunner(executor)


def _ran(w: Waiting) -> int:
    """The positions ``w``'s step computed (none taken from a cached prefix), once answered."""
    f = w.future
    if not f.done() or f.cancelled() or f.exception() is not None:
        return 0
    out = f.result()
    return (out.positions or 0) - out.reused


def _released(session: str) -> ExecutorError:
    return ExecutorError("cancelled", f"session {session!r} was released by its router")


def _mismatch(runner: LayerRunner | StepRunner | WholeRunner, req: StageRequest) -> ExecutorError:
    return ExecutorError(
        "bad_request",
        f"{req.model_id} was sent as a {type(req).__name__}, but this node's executor "
        f"({runner.executor.name}, kind {runner.kind!r}) does not take those",
    )
