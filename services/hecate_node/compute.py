"""A node's generative compute: one worker thread, the waiting steps run as batches.

Every generation step a node is sent waits here until the compute thread is free,
then runs with every other step that waited meanwhile (continuous batching: sessions
join and leave between batches). The event loop only queues and resolves, so it stays
free for heartbeats and the bus however long compute takes; one thread, because two
batches at once would only share the same cores and each take twice as long.

Which steps share a batch is :func:`hecate_node.batching.take_batch`'s rule (a bound
on prefill rows, one step per session).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from opentelemetry import trace

from hecate.model.executor import ExecutorError, StepInput, StepOutput
from hecate_node.batching import take_batch

R = TypeVar("R")
RunBatch = Callable[[list[StepInput]], list[StepOutput | ExecutorError]]
#: Told after each batch: the nanoseconds it computed and the steps it answered.
OnBatch = Callable[[int, list["Waiting"]], None]


@dataclass
class Waiting:
    req: StepInput
    future: asyncio.Future[StepOutput]
    delay_ns: int = 0  # the injected slowdown it waited out before joining
    joined_ns: int = 0  # when it began waiting (monotonic)
    started_ns: int = 0  # when its batch went to the compute thread
    spent_ns: int = 0  # its batch's compute
    batch: int = 0  # the steps in its batch


def _timed(run: RunBatch, reqs: list[StepInput]) -> tuple[list[StepOutput | ExecutorError], int]:
    """The batch's results and its nanoseconds, timed in the compute thread."""
    started = time.perf_counter_ns()
    results = run(reqs)
    return results, time.perf_counter_ns() - started


class Compute:
    def __init__(
        self,
        run: RunBatch,
        *,
        rows: Callable[[StepInput], int | None],
        prefill_rows: Callable[[], int],
        on_batch: OnBatch,
        tokenize: Callable[[StepInput], None] | None = None,
        gather_s: float = 0.02,
    ) -> None:
        self.run = run
        self.rows = rows
        self.tokenize = tokenize
        # Prompts are rendered and tokenized here, one at a time, before their step
        # waits for a batch: never on the event loop (heartbeats), never on the compute
        # thread (a hostile template would hold every session's batch).
        self._prompts = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hecate-prompts")
        self.prefill_rows = prefill_rows
        self.on_batch = on_batch
        self.waiting: list[Waiting] = []
        self.running = 0  # steps in the batch being computed
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hecate-compute")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.gather_s = gather_s
        self._last_size = 0  # steps in the previous batch
        self._last_s = 0.0  # and its compute time

    async def step(self, req: StepInput, delay_ns: int = 0) -> StepOutput:
        """``req``'s reply, once a batch has run it. Raises :class:`ExecutorError` for
        a step refused on its own, or whatever failed its whole batch."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop())
        loop = asyncio.get_running_loop()
        if self.tokenize is not None:
            await loop.run_in_executor(self._prompts, self.tokenize, req)
        future: asyncio.Future[StepOutput] = loop.create_future()
        waiting = Waiting(req, future, delay_ns, joined_ns=time.monotonic_ns())
        self.waiting.append(waiting)
        self._wake.set()
        try:
            return await future
        finally:
            span = trace.get_current_span()
            if span.is_recording() and waiting.started_ns:
                # Where the stage's time went, on its span: waiting for the compute
                # thread (and the batch's gather), then the batch it ran in.
                span.set_attribute(
                    "hecate.queue_ms", (waiting.started_ns - waiting.joined_ns) / 1e6
                )
                span.set_attribute("hecate.compute_ms", waiting.spent_ns / 1e6)
                span.set_attribute("hecate.batch", waiting.batch)

    async def supervised(self) -> None:
        """The batching loop, run by a caller that supervises it (the node's task
        group: a failure here is logged and stops the node, never vanishes). Without
        one, :meth:`step` starts the loop itself."""
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        await self._loop()

    async def offload(self, fn: Callable[..., R], *args: Any) -> R:
        """Run ``fn`` on the compute thread, between batches (a warm-up pass is compute
        like any other, and timed as such)."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._gather()
            while self.waiting:
                live = [w for w in self.waiting if not w.future.done()]  # callers gone
                batch, self.waiting = take_batch(
                    live,
                    key=lambda w: (w.req.layer_start, w.req.layer_end, w.req.session),
                    rows=self._rows,
                    prefill_rows=self.prefill_rows(),
                )
                if not batch:
                    break
                self.running = self._last_size = len(batch)
                started = time.monotonic_ns()
                for w in batch:
                    w.started_ns, w.batch = started, len(batch)
                try:
                    results, spent = await loop.run_in_executor(
                        self._thread, _timed, self.run, [w.req for w in batch]
                    )
                except Exception as exc:  # the whole batch failed (out of memory, a bug)
                    for w in batch:
                        if not w.future.done():
                            w.future.set_exception(exc)
                    continue
                finally:
                    self.running = 0
                self._last_s = spent / 1e9
                for w in batch:
                    w.spent_ns = spent
                for w, result in zip(batch, results, strict=True):
                    if w.future.done():
                        continue
                    if isinstance(result, ExecutorError):
                        w.future.set_exception(result)
                    else:
                        w.future.set_result(result)
                self.on_batch(spent, batch)  # each step's answer set: what it ran is known

    def _rows(self, waiting: Waiting) -> int | None:
        try:
            return self.rows(waiting.req)
        except Exception:  # unknown is safe: it only keeps the step out of a full batch
            return None

    async def _gather(self) -> None:
        """Let the rest of a burst in before an idle thread starts on its first step.

        Sessions that ran together on the previous stage arrive here as a burst of
        messages a millisecond or two apart; started at once, the first would run alone
        and the others next, and the sessions would drift apart into batches of one, each
        paying for every weight read. So when fewer steps wait than ran in the last
        batch, wait for the others, at most ``gather_s`` and half the last batch's time."""
        loop = asyncio.get_running_loop()
        # At most half the last batch's compute: the wait never costs more than half a
        # step, and a burst delayed by the OS scheduler on busy cores still makes it.
        deadline = loop.time() + min(self.gather_s, self._last_s / 2)
        while len(self.waiting) < self._last_size:
            left = deadline - loop.time()
            if left <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), left)
            except TimeoutError:
                return

    def refuse(self, session: str, error: ExecutorError) -> int:
        """Fail the steps of ``session`` still waiting for a batch; how many there were."""
        refused = 0
        for w in self.waiting:
            if w.req.session == session and not w.future.done():
                w.future.set_exception(error)
                refused += 1
        return refused

    def close(self) -> None:
        """Stop taking batches; a batch computing finishes in its thread, unawaited."""
        if self._task is not None:
            self._task.cancel()
        self._thread.shutdown(wait=False, cancel_futures=True)
        self._prompts.shutdown(wait=False, cancel_futures=True)
