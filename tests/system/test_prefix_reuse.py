"""Prompt prefixes reused across requests on SmolLM2's three stages, hop by hop and
chained: a chat's next turn starts from the cached positions of the last one on every
stage, answers exactly what the same prompt answers computed whole, and another tenant
sending the very same messages is never served from the first tenant's cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from hecate.wire.common import ChatMessage
from hecate.wire.messages import InferRequest
from tests.support.swarm import Processes
from tests.support.waits import endpoint_data, stats
from tests.system.test_swarm_generation import ask, ready, start

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

NODES = ("a", "b", "c")
SYSTEM = (
    "You are the help desk of a small public library. Answer in one sentence, say on "
    "which floor the book is kept, and never make up a title. "
) * 4


def turn(tenant: str, *questions: str) -> InferRequest:
    messages = [ChatMessage(role="system", content=SYSTEM)]
    for q in questions:
        messages.append(ChatMessage(role="user", content=q))
    return InferRequest(prompt="", messages=messages, max_tokens=8, tenant=tenant)


async def prefixes(client: Client) -> dict[str, dict[str, Any]]:
    out = {}
    for n in NODES:
        data = endpoint_data(await stats(client, "node", n), "run")
        assert data is not None
        out[n] = data["prefixes"]
    return out


@pytest.mark.parametrize("dispatch", ["hop", "chain"])
async def test_a_tenants_next_turn_reuses_its_prefix_on_every_stage_and_nobody_elses(
    processes: Processes, client: Client, tmp_path: Path, dispatch: str
) -> None:
    start(processes, tmp_path, list(NODES), pipelines=1, dispatch=dispatch)
    await ready(client)
    # Bob's second turn, computed whole (nothing of his is cached): the reference.
    cold = await ask(client, turn("bob", "Where is Moby Dick?", "And Emma?"))
    assert cold.ok, cold.error
    before = await prefixes(client)
    first = await ask(client, turn("alice", "Where is Moby Dick?"))
    assert first.ok, first.error
    warm = await ask(client, turn("alice", "Where is Moby Dick?", "And Emma?"))
    assert warm.ok, warm.error
    after = await prefixes(client)
    assert after["a"]["hits"] == before["a"]["hits"] + 1  # Alice's second turn
    reused = after["a"]["reused_positions"] - before["a"]["reused_positions"]
    assert reused >= 64  # the system prompt at least
    # Every later stage took the same positions from its own cache.
    for n in ("b", "c"):
        assert after[n]["reused_positions"] - before[n]["reused_positions"] == reused
    assert warm.output == cold.output  # bit-equal numbers: the same greedy text
    # Each answer says where its router sent it as to a prefix kept.
    assert (cold.prefix, first.prefix, warm.prefix) == ("none", "none", "toward")
    assert warm.prompt_tokens == cold.prompt_tokens
    # Bob again, the very same messages Alice cached: none of hers is his.
    again = await ask(client, turn("carol", "Where is Moby Dick?", "And Emma?"))
    final = await prefixes(client)
    assert again.ok, again.error
    assert again.output == cold.output
    assert final["a"]["hits"] == after["a"]["hits"]
    assert final["a"]["misses"] == after["a"]["misses"] + 1
