"""Which waiting steps a node runs together (the pure rule), and the compute shell that
runs them on one thread (driven with the generative executor over small random
weights: no model file, no bus)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate.model.executor import ExecutorError, StepInput, StepOutput
from hecate_node.batching import take_batch
from hecate_node.compute import Compute, Waiting
from tests.shared.engine.test_llama_batch import Small, request

Item = tuple[str, int | None]  # (session, rows)


def split(waiting: list[Item], prefill_rows: int, max_batch: int = 64) -> list[list[Item]]:
    """Every batch, until nothing waits."""
    batches = []
    while waiting:
        batch, waiting = take_batch(
            waiting,
            key=lambda i: i[0],
            rows=lambda i: i[1],
            prefill_rows=prefill_rows,
            max_batch=max_batch,
        )
        batches.append(batch)
    return batches


items = st.lists(
    st.tuples(st.sampled_from("abcdefgh"), st.one_of(st.none(), st.integers(1, 300))),
    max_size=40,
)


@given(waiting=items, prefill_rows=st.integers(1, 256), max_batch=st.integers(1, 16))
def test_every_step_runs_once_in_order_within_the_bounds(
    waiting: list[Item], prefill_rows: int, max_batch: int
) -> None:
    batches = split(list(waiting), prefill_rows, max_batch)
    assert Counter(x for b in batches for x in b) == Counter(waiting)
    for batch in batches:
        assert batch  # progress: the oldest always gets in
        assert len(batch) <= max_batch
        sessions = [s for s, _ in batch]
        assert len(set(sessions)) == len(sessions)  # a session once per batch
        heavy = [prefill_rows if n is None else n for _, n in batch if n != 1]
        assert len(heavy) <= 1 or sum(heavy) <= prefill_rows
    # A session's steps keep their order across batches.
    for session in {s for s, _ in waiting}:
        assert [x for b in batches for x in b if x[0] == session] == [
            x for x in waiting if x[0] == session
        ]


def test_decode_steps_all_join_one_prefill_chunk() -> None:
    waiting: list[Item] = [("a", 1), ("p", 256), ("b", 1), ("q", None), ("c", 1), ("r", 40)]
    batch, rest = take_batch(waiting, key=lambda i: i[0], rows=lambda i: i[1], prefill_rows=256)
    assert batch == [("a", 1), ("p", 256), ("b", 1), ("c", 1)]
    assert rest == [("q", None), ("r", 40)]
    # Small prefills share a batch up to the bound.
    batch, rest = take_batch(
        [("p", 100), ("q", 100), ("r", 100)],
        key=lambda i: i[0],
        rows=lambda i: i[1],
        prefill_rows=256,
    )
    assert batch == [("p", 100), ("q", 100)]


def compute(llm: Small, batches: list[list[Waiting]]) -> Compute:
    return Compute(
        llm.execute,
        rows=llm.rows,
        prefill_rows=lambda: llm.prefill_chunk,
        on_batch=lambda _ns, batch: batches.append(batch),
    )


async def test_steps_waiting_together_run_as_one_batch_and_answer_as_alone() -> None:
    llm, batches = Small(chunk=128), list[list[Waiting]]()  # room for all eight prompts' rows
    runner = compute(llm, batches)
    prompts = [[(7 * j + k) % 90 for k in range(5 + j)] for j in range(8)]
    try:
        first = await asyncio.gather(
            *(runner.step(request(session=f"s{j}", tokens=p)) for j, p in enumerate(prompts))
        )
        second = await asyncio.gather(
            *(
                runner.step(
                    request(session=f"s{j}", position=len(p), tokens=[first[j].token or 0], step=1)
                )
                for j, p in enumerate(prompts)
            )
        )
    finally:
        runner.close()
    assert [len(b) for b in batches] == [8, 8]
    alone = Small(chunk=64)
    for j, p in enumerate(prompts):
        one = alone.step(request(session=f"x{j}", tokens=p))
        two = alone.step(request(session=f"x{j}", position=len(p), tokens=[one.token or 0], step=1))
        assert (first[j].token, second[j].token) == (one.token, two.token)
        assert first[j].positions == len(p)
        assert second[j].positions == 1


async def test_prompts_still_to_tokenize_run_one_a_batch_beside_decode_steps() -> None:
    llm, batches = Small(chunk=64), list[list[Waiting]]()
    runner = compute(llm, batches)
    try:
        started = await runner.step(request(session="d", tokens=[1, 2, 3]))
        await asyncio.gather(
            runner.step(request(session="p", prompt="one prompt")),
            runner.step(request(session="q", prompt="another prompt")),
            runner.step(request(session="d", position=3, tokens=[started.token or 0], step=1)),
        )
    finally:
        runner.close()
    assert [[w.req.session for w in b] for b in batches] == [["d"], ["p", "d"], ["q"]]


async def test_a_refused_step_fails_alone_and_a_failed_batch_fails_all() -> None:
    llm, batches = Small(chunk=64), list[list[Waiting]]()
    runner = compute(llm, batches)
    try:
        ok, lost = await asyncio.gather(
            runner.step(request(session="a", tokens=[1, 2])),
            runner.step(request(session="b", position=9, tokens=[1])),
            return_exceptions=True,
        )
    finally:
        runner.close()
    assert isinstance(ok, StepOutput)
    assert isinstance(lost, ExecutorError)
    assert lost.code == "session_lost"

    def broken(reqs: list[StepInput]) -> list[StepOutput | ExecutorError]:
        raise MemoryError(f"{len(reqs)} steps")

    failing = Compute(broken, rows=lambda _r: 1, prefill_rows=lambda: 1, on_batch=lambda *_: None)
    try:
        results = await asyncio.gather(
            failing.step(request(session="a")),
            failing.step(request(session="b")),
            return_exceptions=True,
        )
    finally:
        failing.close()
    assert all(isinstance(r, MemoryError) for r in results)
    with pytest.raises(MemoryError):
        raise results[0]  # type: ignore[misc]


async def test_a_supervised_loop_that_fails_raises_to_its_supervisor() -> None:
    """The node runs the batching loop in its task group (Runner.loops): a defect in the
    loop itself reaches the group, which logs it and stops the node, instead of the
    loop vanishing and the steps waiting on it hanging."""
    llm = Small(chunk=64)

    def bad_bookkeeping(_spent: int, _batch: list[Waiting]) -> None:
        raise RuntimeError("a defect after the batch")

    runner = Compute(llm.execute, rows=llm.rows, prefill_rows=lambda: 64, on_batch=bad_bookkeeping)

    async def node() -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(runner.supervised())
            tg.create_task(runner.step(request(session="a", tokens=[1, 2])))

    try:
        with pytest.raises(ExceptionGroup) as group:
            await node()
        assert group.group_contains(RuntimeError, match="a defect after the batch")
    finally:
        runner.close()


async def test_a_step_s_span_says_how_long_it_queued_and_computed_and_with_how_many() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    llm, batches = Small(chunk=128), list[list[Waiting]]()
    runner = compute(llm, batches)

    async def traced(j: int) -> None:
        with tracer.start_as_current_span(f"stage {j}"):
            await runner.step(request(session=f"s{j}", tokens=[1, 2, 3]))

    try:
        await asyncio.gather(*(traced(j) for j in range(3)))
    finally:
        runner.close()
    spans = exporter.get_finished_spans()
    assert len(spans) == 3
    for span in spans:
        attrs = dict(span.attributes or {})
        queued, computed = (
            float(str(attrs["hecate.queue_ms"])),
            float(str(attrs["hecate.compute_ms"])),
        )
        assert attrs["hecate.batch"] == 3
        assert computed > 0
        assert queued >= 0
        assert span.end_time is not None
        assert span.start_time is not None
        # The stage's span covers its queueing and its batch.
        assert (span.end_time - span.start_time) / 1e6 >= queued + computed
