"""Long prompts routed hop by hop answer exactly the single-process text.

test_long_prompt.py checks chained routes against llama.cpp (and ``prompt_too_long``);
here every chunk's activation goes back to the router and on to the next stage, and the
answer must be the greedy text of our own model in one process, token for token: a
chunk's rows, batched or not, must add up to the state a one-process run builds."""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client

from hecate.bus.settle import settled
from hecate.llm.reference import greedy_text
from hecate.llm.store import pull
from hecate.llm.tokenizer import load_tokenizer
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest
from tests.support.swarm import Processes
from tests.system.test_swarm_generation import MODEL, ready, start

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

# 1,200 tokens is five chunks hop by hop, every mechanism a longer prompt uses (its
# last chunk partial); 600 to 4,000 tokens run through chained stages in
# test_long_prompt.py against llama.cpp. The one-process reference computes the whole
# prefill again, here in the test: 2,000 tokens took 32 s of the suite, 4,000 more.
LENGTHS = (1200,)
TOKENS = 4
SENTENCE = "The keeper of the lighthouse wrote down every ship that passed the rocks. "


@functools.cache
def prompt(tokens: int) -> str:
    """A prompt of about ``tokens`` tokens that ends with a question to continue."""
    tok = load_tokenizer(pull(MODEL, progress=lambda _line: None))
    per = len(tok.encode(SENTENCE * 10).ids) / 10  # repeated, a sentence runs into the next
    return SENTENCE * round(tokens / per) + "The last ship to pass was"


@functools.cache
def reference(text: str) -> tuple[int, str]:
    """The prompt's length in tokens and its greedy continuation in one process, the
    prompt run in the first stage's chunks as the swarm runs it."""
    path = pull(MODEL, progress=lambda _line: None)
    return len(load_tokenizer(path).encode(text).ids), greedy_text(path, text, TOKENS)


async def test_a_long_prompt_hop_by_hop_answers_the_single_process_text(
    processes: Processes, client: Client, tmp_path: Path
) -> None:
    start(processes, tmp_path, ["a", "b", "c"], pipelines=1, dispatch="hop")
    await ready(client)
    failovers = await client.subscribe("hecate.events.failover")
    for length in LENGTHS:
        text = prompt(length)
        tokens, expected = reference(text)
        assert abs(tokens - length) < 0.02 * length
        request = InferRequest(prompt=text, max_tokens=TOKENS)
        msg = await client.request(subjects.infer(MODEL), msgspec.json.encode(request), timeout=300)
        reply = msgspec.json.decode(msg.data, type=InferReply)
        assert reply.ok, (length, reply.error)
        assert reply.output == expected, length
        assert reply.attempts == 1
    await settled(client)
    assert failovers.pending_msgs == 0
