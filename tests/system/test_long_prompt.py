"""Prompts as long as the model allows, through three stage processes.

SmolLM2's hidden state is 576 float32 per position: a whole 4,000-token prompt's
activation is about 9 MB, nine times NATS' 1 MB max_payload. The first stage runs a
long prompt a chunk at a time (each chunk's activation fits the bus) and the router
sends the rest until the prompt is in, so 600-, 2,000- and 4,000-token prompts answer;
one that with the tokens asked for passes the model's 8,192-token context is refused as
``prompt_too_long``, for what it is, with nobody blamed.

"Answer correctly" is checked against llama.cpp, an implementation that is not ours:
``golden/smollm2-135m-long-prompts.json`` (written by ``golden/make_long_golden.py``)
holds llama.cpp's greedy tokens after each prompt and the margin of each choice. The
swarm's text must be llama.cpp's up to the first step where llama.cpp's top two logits
are within ``MARGIN`` (a near-tie that float rounding may flip; test_golden.py measured
ours against llama.cpp's there). The prompts are numbered travel notes, so the next
note's place name depends on positions thousands of tokens back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client

from hecate.bus.settle import settled
from hecate.llm.store import pull
from hecate.llm.tokenizer import load_tokenizer
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest
from tests.support.swarm import Processes
from tests.system.test_swarm_generation import MODEL, ask, ready, start

# The golden texts the single-process engine is checked against (tests/shared/engine).
ENGINE_GOLDEN = Path(__file__).resolve().parents[1] / "shared" / "engine" / "golden"

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

GOLDEN = json.loads((ENGINE_GOLDEN / "smollm2-135m-long-prompts.json").read_text())
MARGIN = 0.5  # as test_golden.py


def expected(golden: dict[str, Any]) -> str:
    """llama.cpp's greedy text up to its first near-tie."""
    sure = next((i for i, m in enumerate(golden["margins"]) if m < MARGIN), len(golden["tokens"]))
    tok = load_tokenizer(pull(MODEL, progress=lambda _line: None))
    return str(tok.decode(golden["tokens"][:sure]))


@pytest.mark.heavy
async def test_prompts_of_600_2000_and_4000_tokens_answer_through_three_stages(
    processes: Processes, client: Client, tmp_path: Path
) -> None:
    start(processes, tmp_path, ["a", "b", "c"], pipelines=1, dispatch="chain")
    await ready(client)
    failovers = await client.subscribe("hecate.events.failover")
    for golden in GOLDEN["prompts"]:
        tokens = len(golden["prompt_ids"])
        request = InferRequest(prompt=golden["text"], max_tokens=GOLDEN["steps"])
        # A 4,000-token prefill is tens of seconds of numpy on two cores.
        msg = await client.request(subjects.infer(MODEL), msgspec.json.encode(request), timeout=300)
        reply = msgspec.json.decode(msg.data, type=InferReply)
        assert reply.ok, (tokens, reply.error)
        want = expected(golden)
        assert len(want) >= 10, "the golden file checks too little of this prompt"
        assert (reply.output or "").startswith(want), (tokens, reply.output, want)
    await settled(client)
    assert failovers.pending_msgs == 0  # long prompts are work, not failures


# The refusal is the executors' context check, the same on either path: make test runs it
# chained, make test-heavy hop by hop as well.
@pytest.mark.parametrize("dispatch", [pytest.param("hop", marks=pytest.mark.heavy), "chain"])
async def test_a_prompt_past_the_context_is_prompt_too_long_not_a_lost_node(
    processes: Processes, client: Client, tmp_path: Path, dispatch: str
) -> None:
    start(processes, tmp_path, ["a", "b", "c", "d", "e", "f"], pipelines=2, dispatch=dispatch)
    await ready(client)
    failovers = await client.subscribe("hecate.events.failover")
    longest = GOLDEN["prompts"][-1]["text"]  # about 4,000 tokens: thrice is past 8,192
    reply = await ask(client, InferRequest(prompt="\n".join([longest] * 3), max_tokens=2))
    assert not reply.ok
    assert reply.error is not None
    assert reply.error.code == "prompt_too_long", reply.error
    assert "8192" in reply.error.message.replace(",", "")
    assert reply.attempts == 1
    await settled(client)
    assert failovers.pending_msgs == 0  # nobody was blamed
    short = await ask(client, InferRequest(prompt="The capital of France is", max_tokens=2))
    assert short.ok, short.error
