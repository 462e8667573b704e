"""Integration fixtures: a real nats-server per test, services as real processes.

Nothing here mocks the bus. Each test gets its own server on ephemeral ports (start +
stop costs tens of milliseconds) and its own process tree, killed at teardown.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import nats
import pytest
from nats.aio.client import Client

from hecate.bus.secure import SecureBus
from hecate.bus.server import NatsServer
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest
from hecate_launcher import ProcessSpec, Supervisor, hecate_command

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
_reply = msgspec.json.Decoder(InferReply)


hecate_argv = hecate_command  # the command an operator types


def up_credentials(state: Path, user: str) -> dict[str, str]:
    """The variables ``. <state>/secure/<user>.env`` exports (``hecate up --secure``)."""
    lines = (state / "secure" / f"{user}.env").read_text().splitlines()
    return dict(line.removeprefix("export ").split("=", 1) for line in lines if line)


def infer_when_up(
    state: Path,
    *args: str,
    within: float,
    user: str | None = None,
    poll_s: float = 0.2,
) -> subprocess.CompletedProcess[str]:
    """``hecate infer ARGS --nats <URL of the hecate up on state>``, again and again
    until it answers (exit 0) or ``within`` seconds pass; the last attempt. ``user``:
    as that user of a ``hecate up --secure``."""
    url_file = state / "nats.url"
    deadline = time.monotonic() + within
    answer = None
    while time.monotonic() < deadline:
        if url_file.exists():  # written once the server, and its credentials, are ready
            env = up_credentials(state, user) if user else None
            answer = subprocess.run(
                [*hecate_argv(), "infer", *args, "--nats", url_file.read_text().strip()],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                env={**os.environ, **env} if env else None,
            )
            if answer.returncode == 0:
                break
        time.sleep(poll_s)
    assert answer is not None, f"hecate up wrote no {url_file} in {within} s"
    return answer


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "nats").start()
    yield server
    server.stop()


class Processes:
    """Service processes started with the real ``hecate`` command by the one supervisor
    (:class:`hecate_launcher.Supervisor`); logs go to files. ``secure``: a locked-down bus,
    each service logging in as its role, each node as itself."""

    def __init__(self, url: str, logs: Path, secure: SecureBus | None = None) -> None:
        self.url = url
        self.logs = logs
        self.secure = secure
        self.supervisor = Supervisor(logs=logs)  # os.environ as it is at each start

    @property
    def procs(self) -> dict[str, subprocess.Popen[bytes]]:
        return self.supervisor.procs

    def start(self, label: str, *args: str) -> subprocess.Popen[bytes]:
        env = {"OPENBLAS_NUM_THREADS": "1", "HECATE_LOG_LEVEL": "INFO"}
        if self.secure is not None:
            env.update(self.secure.service_credentials(args).to_env())
        return self.supervisor.start(ProcessSpec(label, (*args, "--nats", self.url), env))

    def node(
        self, node_id: str, capacity: int, latency_ms: float = 5.0, score: float = 1.0
    ) -> subprocess.Popen[bytes]:
        return self.start(
            f"node-{node_id}",
            "node",
            "--id",
            node_id,
            "--capacity-layers",
            str(capacity),
            "--latency-ms",
            str(latency_ms),
            "--score",
            str(score),
        )

    def kill(self, label: str, sig: int = signal.SIGKILL) -> None:
        self.supervisor.kill(label, sig)

    def log(self, label: str) -> str:
        return self.supervisor.log(label)

    def stop_all(self) -> None:
        self.supervisor.stop()


@pytest.fixture
def processes(nats_server: NatsServer, tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(url=nats_server.url, logs=tmp_path)
    yield procs
    procs.stop_all()


@pytest.fixture
async def client(nats_server: NatsServer) -> AsyncIterator[Client]:
    nc = await nats.connect(nats_server.url)
    yield nc
    await nc.close()


async def infer(
    nc: Client, model: str, prompt: str, max_tokens: int = 8, timeout: float = 10.0
) -> InferReply:
    body = msgspec.json.encode(InferRequest(prompt=prompt, max_tokens=max_tokens))
    msg = await nc.request(subjects.infer(model), body, timeout=timeout)
    return _reply.decode(msg.data)


async def wait_until_serving(nc: Client, model: str, timeout: float = 20.0) -> InferReply:
    """Poll with real requests until the swarm answers (plan published, routers ready)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            reply = await infer(nc, model, "ready?", timeout=2.0)
            if reply.ok:
                return reply
            last = reply.error
        except Exception as exc:
            last = exc
        await asyncio.sleep(0.1)
    raise AssertionError(f"swarm not serving {model} after {timeout}s: {last!r}")


def start_swarm(
    procs: Processes,
    topology: Path,
    nodes: list[tuple[str, int, float, float]],
    *,
    routers: int = 1,
    strategy: str = "greedy",
    pipelines: int = 2,
    dispatch: str = "hop",
    stage_timeout_ms: float = 1500,
    route_wait_ms: float | None = None,
    telemetry_args: tuple[str, ...] = (),
    planner_args: tuple[str, ...] = (),
) -> None:
    procs.start("telemetry", "telemetry", "--id", "telemetry", *telemetry_args)
    for i in range(1, routers + 1):
        start_router(procs, f"router-{i}", topology, stage_timeout_ms, dispatch, route_wait_ms)
    for node_id, capacity, latency, score in nodes:
        procs.node(node_id, capacity, latency, score)
    # The planner last: it roll-calls the nodes already up, so its first plan holds them
    # all even when a loaded machine starts them seconds apart (nodes that join after a
    # first plan only add capacity; the plan does not reshuffle to make a new replica).
    start_planner(procs, topology, pipelines, strategy=strategy, extra=planner_args)


def start_planner(
    procs: Processes,
    topology: Path,
    pipelines: int | str,
    *,
    settle_ms: int = 300,
    strategy: str = "greedy",
    extra: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    """The planner, as ``hecate up`` starts it: ``pipelines`` copies (or ``auto``);
    ``extra`` flags after those."""
    return procs.start(
        "planner",
        "planner",
        "--id",
        "planner",
        "--topology",
        str(topology),
        "--strategy",
        strategy,
        "--pipelines",
        str(pipelines),
        "--settle-ms",
        str(settle_ms),
        *extra,
    )


def start_router(
    procs: Processes,
    router_id: str,
    topology: Path,
    stage_timeout_ms: float = 1500,
    dispatch: str = "hop",
    route_wait_ms: float | None = None,
) -> subprocess.Popen[bytes]:
    """``route_wait_ms``: how long a request left with no route waits for one (the
    router's default when None)."""
    wait = ("--route-wait-ms", str(route_wait_ms)) if route_wait_ms is not None else ()
    return procs.start(
        router_id,
        "router",
        "--id",
        router_id,
        "--topology",
        str(topology),
        "--stage-timeout-ms",
        str(stage_timeout_ms),
        "--dispatch",
        dispatch,
        "--stale-ms",
        "500",
        *wait,
    )


SWARM_NODES = [
    ("gpu", 12, 3.5, 4.0),
    ("laptop", 8, 12.0, 1.5),
    ("desktop", 6, 8.0, 2.0),
    ("pi", 4, 40.0, 0.5),
]
