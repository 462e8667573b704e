"""The swarm ``hecate bench gateway`` measures, standing: ``hecate up``'s processes for a
topology and a gateway beside them, and the CPU each of them uses (see
:mod:`hecate_dev.bench.gateway`)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from hecate.bus.server import NatsServer
from hecate_dev.bench.gateway_load import TIMEOUT_S
from hecate_launcher import ProcessSpec, Supervisor, plan_commands


# -- the swarm and its gateway ----------------------------------------------------------
@dataclass
class Standing:
    """A swarm standing with its gateway: where to reach them, and every process."""

    url: str  # NATS
    base: str  # the gateway, http://127.0.0.1:PORT
    pids: dict[str, int] = field(default_factory=dict)  # label -> pid


def bench_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, HECATE_LOG_LEVEL="WARNING", **extra)
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)  # measure without exporting
    return env


def _listening(log: Path, proc: subprocess.Popen[bytes], wait_s: float) -> int:
    """The port the gateway says it listens on (its ``listening`` log line)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if '"listening"' in line:
                return int(json.loads(line)["port"])
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited ({proc.returncode}); see {log}")
        time.sleep(0.05)
    raise RuntimeError(f"the gateway never said where it listens; see {log}")


@contextlib.contextmanager
def standing(
    workdir: Path, topology: Path, env: dict[str, str], router_args: tuple[str, ...] = ()
) -> Iterator[Standing]:
    """``hecate up --topology TOPOLOGY``'s processes and a gateway (``--open``, any free
    port), logs in ``workdir``; everything stopped (SIGTERM, then SIGKILL) on the way out.
    ``router_args``: flags added to every router's command."""
    server = NatsServer(workdir / "nats", max_payload=1024 * 1024).start()
    swarm = Supervisor(env=env, logs=workdir)
    try:
        shape = argparse.Namespace(
            topology=str(topology), strategy="greedy", pipelines=2, routers=2
        )
        for spec in plan_commands(shape, server.url):
            if spec.argv[:1] == ("router",):
                spec = dataclasses.replace(spec, argv=(*spec.argv, *router_args))
            swarm.start(spec)
        # The gateway at its own default level: its "listening" line says the port.
        gateway = ("gateway", "--nats", server.url, "--open", "--port", "0", "--id", "bench")
        swarm.start(ProcessSpec("gateway", gateway, {"HECATE_LOG_LEVEL": "INFO"}))
        port = _listening(swarm.log_path("gateway"), swarm.procs["gateway"], 60.0)
        assert server.process is not None
        pids = {"nats-server": server.process.pid, **{k: p.pid for k, p in swarm.procs.items()}}
        yield Standing(server.url, f"http://127.0.0.1:{port}", pids)
    finally:
        swarm.stop()
        server.stop()


def wait_serving(st: Standing, model: str, wait_s: float) -> None:
    """Until the gateway answers a completion of ``model`` (the plan is out, a router
    and its pipeline serve it, the gateway sees it)."""
    deadline = time.monotonic() + wait_s
    body = {"model": model, "prompt": "ready?", "max_tokens": 1}
    last = ""
    while time.monotonic() < deadline:
        try:
            r = httpx.post(f"{st.base}/v1/completions", json=body, timeout=TIMEOUT_S)
            if r.status_code == 200:
                return
            last = r.text
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.2)
    raise RuntimeError(f"the gateway never served {model}: {last}")


# -- CPU of the swarm's processes -------------------------------------------------------
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # the name may hold spaces
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def role(label: str) -> str:
    """A process's part of the CPU table."""
    if label.startswith("router"):
        return "routers"
    if label.startswith("node"):
        return "nodes"
    if label in ("gateway", "nats-server"):
        return label
    return "other services"


def cores(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Cores used per role between two readings of every process's CPU seconds."""
    used: dict[str, float] = {}
    for label, start in before.items():
        r = role(label)
        used[r] = used.get(r, 0.0) + (after.get(label, start) - start) / seconds
    return {r: round(c, 2) for r, c in sorted(used.items())}
