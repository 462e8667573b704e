"""A gateway in front of a swarm, for the tests that speak to the swarm as an OpenAI
client does: where the gateway listens, and a one-node SmolLM2 swarm behind one."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from hecate.bus.server import NatsServer
from hecate.llm.store import pull
from tests.support.swarm import Processes
from tests.support.waits import GENEROUS_S


def gateway_port(procs: Processes) -> int:
    deadline = time.monotonic() + GENEROUS_S
    while time.monotonic() < deadline:
        for line in procs.log("gateway").splitlines():
            if '"listening"' in line:
                return int(json.loads(line)["port"])
        assert procs.procs["gateway"].poll() is None, procs.log("gateway")
        time.sleep(0.05)
    raise AssertionError("the gateway never said where it listens")


@contextlib.contextmanager
def llm_gateway(tmp: Path, model: str = "smollm2-135m") -> Iterator[tuple[str, str]]:
    """(NATS url, gateway base URL) of a one-node swarm of ``model`` (all its 30 layers
    on one node: one process to load) behind an open gateway, once a first token
    comes back through it."""
    pull(model, progress=lambda _line: None)
    server = NatsServer(tmp / "nats").start()
    procs = Processes(url=server.url, logs=tmp)
    try:
        topology = tmp / "llm.json"
        topology.write_text(
            json.dumps(
                {
                    "models": [{"id": model, "layers": 30, "role": "base", "executor": "smollm2"}],
                    "nodes": [{"id": "solo", "capacity_layers": 30, "executor": "smollm2"}],
                }
            )
        )
        procs.start("telemetry", "telemetry", "--id", "telemetry")
        procs.start(
            "planner", "planner", "--id", "planner", "--topology", str(topology),
            "--pipelines", "1", "--settle-ms", "300",
        )  # fmt: skip
        procs.start("router-1", "router", "--id", "router-1", "--stage-timeout-ms", "10000")
        procs.start(
            "node-solo", "node", "--id", "solo", "--capacity-layers", "30",
            "--executor", "smollm2",
        )  # fmt: skip
        procs.start("gateway", "gateway", "--open", "--port", "0")
        base = f"http://127.0.0.1:{gateway_port(procs)}"
        deadline = time.monotonic() + 120
        while True:  # ready, and the model loaded: a first token comes back
            body = {"model": model, "prompt": "Hi", "max_tokens": 1}
            r = httpx.post(f"{base}/v1/completions", json=body, timeout=GENEROUS_S)
            if r.status_code == 200:
                break
            assert time.monotonic() < deadline, r.text
            time.sleep(0.2)
        yield server.url, base
    finally:
        procs.stop_all()
        server.stop()
