"""A long prompt's first token through 3 chained stages: the engine's nodes with the
first stage running the prompt's chunks ahead, the same nodes one chunk a send, and the
numpy model's nodes one chunk a send (as the swarm ran before either), interleaved.

``hecate bench long`` (or ``python -m hecate_dev.bench.long_prefill``) stands the
3-stage swarm of ``hecate bench llm`` (:func:`hecate_dev.bench.llm_swarm.standing`, one
engine thread a node) once for each arm, ``--rounds`` times, the order rotated from round
to round. Each time, it sends the 3,989-token prompt of the long-prompt golden file once
to warm every range and path, then once timed, the router told not to reuse cached
prefixes (the timed send would otherwise compute nothing). It returns each round's time
to the first token, and whether the engine's texts are the single-process engine's
greedy text (the numpy model's text is its own)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import msgspec
import nats

from hecate.bus.streamed import request_streamed
from hecate.llm.tokenizer import load_tokenizer
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest
from hecate_dev.bench.llm_single import MODEL
from hecate_dev.bench.llm_swarm import standing

STAGES = [[("a", 0, 10), ("b", 10, 20), ("c", 20, 30)]]
GOLDEN = (
    Path(__file__).resolve().parents[3]
    / "tests/shared/engine/golden/smollm2-135m-long-prompts.json"
)
#: Each arm's nodes and what its router is told besides ``--no-prefix-cache``.
ARMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ahead": ("smollm2", ()),
    "one_chunk": ("smollm2", ("--no-run-ahead",)),
    "numpy": ("smollm2-numpy", ("--no-run-ahead",)),
}
TOKENS = 8


async def first_token(url: str, prompt: str) -> tuple[float, str]:
    """Seconds to the first streamed token, and the reply's text."""
    nc = await nats.connect(url)
    first: list[float] = []

    async def got(_msg: object) -> None:
        if not first:
            first.append(time.perf_counter())

    began = time.perf_counter()
    body = msgspec.json.encode(InferRequest(prompt=prompt, max_tokens=TOKENS))
    msg = await request_streamed(nc, subjects.stream(MODEL), body, timeout=300, on_token=got)
    await nc.close()
    reply = msgspec.json.decode(msg.data, type=InferReply)
    if not reply.ok or not first:
        raise RuntimeError(f"the long prompt failed: {reply.error}")
    return first[0] - began, reply.output or ""


def run(*, rounds: int) -> dict[str, Any]:
    """``hecate bench long``: each round, every arm's 3-stage swarm in turn (the order
    rotated round by round), the long prompt's first token on each after one warm-up
    send."""
    from hecate.llm.reference import greedy_text
    from hecate.llm.store import pull

    prompt = json.loads(GOLDEN.read_text())["prompts"][-1]["text"]
    path = pull(MODEL, progress=lambda _line: None)
    names = list(ARMS)
    ttft: dict[str, list[float]] = {a: [] for a in names}
    texts: dict[str, str] = {}
    for i in range(rounds):
        for arm in names[i % len(names) :] + names[: i % len(names)]:
            executor, extra = ARMS[arm]
            # Without the nodes' prefix cache: the timed send would find the warm-up's
            # prompt cached and compute none of it.
            args = ("--no-prefix-cache", *extra)
            with standing(STAGES, dispatch="chain", executor=executor, router_args=args) as swarm:
                asyncio.run(first_token(swarm.url, prompt))  # warm
                seconds, texts[arm] = asyncio.run(first_token(swarm.url, prompt))
            ttft[arm].append(round(seconds, 3))
    want = greedy_text(path, prompt, TOKENS)

    def over(slow: str, fast: str) -> list[float]:
        return [round(a / b, 3) for a, b in zip(ttft[slow], ttft[fast], strict=True)]

    return {
        "rounds": rounds,
        "tokens": TOKENS,
        "prompt_tokens": len(load_tokenizer(path).encode(prompt).ids),
        "stages": [[a, b] for _name, a, b in STAGES[0]],
        "ttft_s": ttft,
        "numpy_over_engine_by_round": over("numpy", "ahead"),
        "one_chunk_over_ahead_by_round": over("one_chunk", "ahead"),
        "engine_text_ok": texts["ahead"] == want and texts["one_chunk"] == want,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(run(rounds=args.rounds), indent=1))


if __name__ == "__main__":
    main()
