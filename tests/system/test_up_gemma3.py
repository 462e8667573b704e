"""``make run ARGS="--topology examples/gemma3.json"``: ``hecate up`` serves Gemma 3 270M
across stages (two 2-stage pipelines of its 18 layers, the cut between sliding layers),
its chat rendered in Gemma's turns and ended at ``<end_of_turn>``, with the text one
process gives for the same prompt. Skipped, saying so, where the model is not in the
model cache (``make models`` pulls it before the tests)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import openai
import pytest

from hecate.llm.reference import greedy_text
from hecate.llm.store import model_path, present
from hecate.llm.template import load_template
from hecate_launcher import hecate_command
from tests.support.swarm import infer_when_up

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MODEL = "gemma3-270m"
QUESTION = "What is the capital of France? Answer in one word."


def test_hecate_up_serves_gemma3_across_stages(tmp_path: Path) -> None:
    if not present(MODEL):
        pytest.skip(f"{MODEL} is not in the model cache (`hecate model pull {MODEL}`)")
    path = model_path(MODEL)
    prompt = load_template(path).render([("user", QUESTION)])
    assert prompt.startswith("<start_of_turn>user\n")  # Gemma's turns, not ChatML
    alone = greedy_text(path, prompt, 24)
    state = tmp_path / "state"
    up = subprocess.Popen(
        [
            *hecate_command(),
            "up",
            "--topology",
            str(EXAMPLES / "gemma3.json"),
            "--state",
            str(state),
            "--gateway",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        ready = infer_when_up(state, MODEL, "Hello", "--max-tokens", "1", within=180, poll_s=0.5)
        assert ready.returncode == 0, ready.stderr
        client = openai.OpenAI(
            base_url=f"{(state / 'gateway.url').read_text().strip()}/v1",
            api_key=(state / "gateway.key").read_text().strip(),
            timeout=60,
        )
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": QUESTION}],
            max_tokens=24,
            temperature=0,
        )
        choice = reply.choices[0]
        assert choice.message.content == alone
        assert reply.usage is not None
        ended = reply.usage.completion_tokens < 24  # at <end_of_turn>, not at the limit
        assert choice.finish_reason == ("stop" if ended else "length")
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=90)
    assert up.returncode == 0, out[-2000:]
    assert "Traceback" not in out, out[-3000:]
