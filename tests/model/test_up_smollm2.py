"""``make run``: ``hecate up`` on the SmolLM2 topology pulls the model, starts six stage
nodes (two 3-stage pipelines) and streams a real generation through them, over NATS and
through the OpenAI-compatible gateway it starts beside them."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
from pathlib import Path

import openai

from hecate.launch import hecate_command
from hecate.llm.store import pull

from ..integration.conftest import infer_when_up

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_hecate_up_serves_smollm2_across_stages(tmp_path: Path) -> None:
    pull("smollm2-135m", progress=lambda _line: None)
    state = tmp_path / "state"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    up = subprocess.Popen(
        [
            *hecate_command(),
            "up",
            "--topology",
            str(EXAMPLES / "smollm2.json"),
            "--state",
            str(state),
            "--gateway",
            f"127.0.0.1:{port}",
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
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1",
            api_key=(state / "gateway.key").read_text().strip(),
            timeout=60,
        )
        stream = client.completions.create(
            model="smollm2-135m", prompt="The capital of France is", max_tokens=4, stream=True
        )
        text = "".join(c.choices[0].text for c in stream if c.choices)
        assert text.rstrip("\n") == answer.stdout.rstrip("\n")  # the CLI ends with one
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=90)
    assert up.returncode == 0, out[-2000:]
    assert "Traceback" not in out, out[-3000:]
    assert "smollm2-135m: already in" in out  # pulled (here: found) before the nodes start
    assert re.search(rf"OpenAI-compatible API at http://127.0.0.1:{port}/v1 \(API key in ", out)
