"""A prompt whose activations outgrow the bus is refused for what it is.

SmolLM2's hidden state is 576 float32 per position, so a prompt of about 800 tokens
makes a stage's activation larger than NATS' 1 MB max_payload. No node fails: the
caller must get ``payload_too_large`` naming the size, not a failover that ends in
"node lost", and the nodes must keep serving."""

from __future__ import annotations

from pathlib import Path

import pytest
from nats.aio.client import Client

from hecate.wire.messages import InferRequest

from ..integration.conftest import Processes
from .test_swarm_generation import ask, ready, start

LONG = " ".join(["The quick brown fox jumps over the lazy dog."] * 90)  # ~900 tokens


@pytest.mark.parametrize("dispatch", ["hop", "chain"])
async def test_a_prompt_too_long_for_the_bus_is_payload_too_large_not_a_lost_node(
    processes: Processes, client: Client, tmp_path: Path, dispatch: str
) -> None:
    start(processes, tmp_path, ["a", "b", "c", "d", "e", "f"], pipelines=2, dispatch=dispatch)
    await ready(client)
    failovers = await client.subscribe("hecate.events.failover")
    reply = await ask(client, InferRequest(prompt=LONG, max_tokens=2))
    assert not reply.ok
    assert reply.error is not None
    assert reply.error.code == "payload_too_large", reply.error
    assert "max_payload" in reply.error.message
    assert reply.attempts == 1
    await client.flush()
    assert failovers.pending_msgs == 0  # nobody was blamed
    short = await ask(client, InferRequest(prompt="The capital of France is", max_tokens=2))
    assert short.ok, short.error
