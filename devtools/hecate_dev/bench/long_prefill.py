"""A long prompt's first token through 3 chained stages: the engine's nodes against the
numpy model's, interleaved.

``python -m hecate_dev.bench.long_prefill`` stands the 3-stage swarm of ``hecate bench
llm`` (:func:`hecate_dev.bench.llm_swarm.standing`, one engine thread a node) once with
``--executor smollm2`` nodes and once with ``smollm2-numpy`` ones, ``--rounds`` times in
turn. Each time, it sends the 3,989-token prompt of the long-prompt golden file once to
warm every range and path, then once timed. It prints each round's time to the first
token and the medians, and checks that the engine's text is the single-process engine's
greedy text (the numpy model's text is its own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import msgspec
import nats

from hecate.bus.streamed import request_streamed
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest
from hecate_dev.bench.llm_single import MODEL
from hecate_dev.bench.llm_swarm import standing

STAGES = [[("a", 0, 10), ("b", 10, 20), ("c", 20, 30)]]
GOLDEN = (
    Path(__file__).resolve().parents[3]
    / "tests/shared/engine/golden/smollm2-135m-long-prompts.json"
)
EXECUTORS = ("smollm2", "smollm2-numpy")
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    from hecate.llm.reference import greedy_text
    from hecate.llm.store import pull

    prompt = json.loads(GOLDEN.read_text())["prompts"][-1]["text"]
    ttft: dict[str, list[float]] = {e: [] for e in EXECUTORS}
    texts: dict[str, str] = {}
    for _ in range(args.rounds):
        for executor in EXECUTORS:
            with standing(STAGES, dispatch="chain", executor=executor) as swarm:
                asyncio.run(first_token(swarm.url, prompt))  # warm
                seconds, texts[executor] = asyncio.run(first_token(swarm.url, prompt))
            ttft[executor].append(round(seconds, 2))
    want = greedy_text(pull(MODEL, progress=lambda _line: None), prompt, TOKENS)
    medians = {e: statistics.median(v) for e, v in ttft.items()}
    print(
        json.dumps(
            {
                "ttft_s": ttft,
                "median_s": medians,
                "numpy_over_engine": round(medians["smollm2-numpy"] / medians["smollm2"], 2),
                "engine_text_ok": texts["smollm2"] == want,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
