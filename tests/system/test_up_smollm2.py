"""``make run``: ``hecate up`` on the SmolLM2 topology pulls the model, starts six stage
nodes (two 3-stage pipelines) and streams a real generation through them, over NATS and
through the OpenAI-compatible gateway it starts beside them, to many people at once."""

from __future__ import annotations

import asyncio
import math
import re
import signal
import subprocess
import time
from pathlib import Path

import openai
import pytest

from hecate.llm.store import pull
from hecate_launcher import hecate_command
from tests.support.swarm import infer_when_up

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def many_users(base: str, state: Path, users: int) -> list[tuple[str, float] | str]:
    """``users`` streaming chat completions at once through the gateway: each one's text
    and time to its first token, or what it failed with."""
    client = openai.AsyncOpenAI(
        base_url=f"{base}/v1",
        api_key=(state / "gateway.key").read_text().strip(),
        max_retries=5,
        timeout=120,
    )

    async def one(i: int) -> tuple[str, float] | str:
        began, first, text = time.monotonic(), math.inf, ""
        try:
            stream = await client.chat.completions.create(
                model="smollm2-135m",
                messages=[{"role": "user", "content": f"Tell me about the number {i}."}],
                max_tokens=16,
                stream=True,
            )
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    first = min(first, time.monotonic() - began)
                    text += chunk.choices[0].delta.content
        except openai.APIError as exc:
            return f"user {i}: {exc!r}"
        return text, first

    try:
        return await asyncio.gather(*(one(i) for i in range(users)))
    finally:
        await client.close()


def test_hecate_up_serves_smollm2_across_stages(tmp_path: Path) -> None:
    pull("smollm2-135m", progress=lambda _line: None)
    state = tmp_path / "state"
    up = subprocess.Popen(
        [
            *hecate_command(),
            "up",
            "--topology",
            str(EXAMPLES / "smollm2.json"),
            "--state",
            str(state),
            "--gateway",
            "127.0.0.1:0",  # any free port, written to gateway.url once listening
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        answer = infer_when_up(
            state,
            "smollm2-135m",
            "The capital of France is",
            "--max-tokens",
            "4",
            "--timeout",
            "10",
            within=120,
            poll_s=0.5,
        )
        assert answer.returncode == 0, answer.stderr
        assert answer.stdout.startswith(" Paris"), answer.stdout
        # The official client, pointed where `hecate up` said, with the key it made.
        base = (state / "gateway.url").read_text().strip()
        client = openai.OpenAI(
            base_url=f"{base}/v1",
            api_key=(state / "gateway.key").read_text().strip(),
            timeout=60,
        )
        stream = client.completions.create(
            model="smollm2-135m", prompt="The capital of France is", max_tokens=4, stream=True
        )
        text = "".join(c.choices[0].text for c in stream if c.choices)
        assert text.rstrip("\n") == answer.stdout.rstrip("\n")  # the CLI ends with one
        # Many people at once on the freshly started swarm, as the official client
        # sends them (its own retries on): every one is answered, the line waits as long
        # as the generations ahead of it take, and nobody is told to come back later.
        for users in (16, 32):
            outcomes = asyncio.run(many_users(base, state, users))
            answered = [o for o in outcomes if not isinstance(o, str)]
            assert len(answered) == users, [o for o in outcomes if isinstance(o, str)]
            assert all(text for text, _first in answered), answered
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=90)
    assert up.returncode == 0, out[-2000:]
    assert "Traceback" not in out, out[-3000:]
    assert "smollm2-135m: already in" in out  # pulled (here: found) before the nodes start
    assert re.search(rf"OpenAI-compatible API at {re.escape(base)}/v1 \(API key in ", out)
