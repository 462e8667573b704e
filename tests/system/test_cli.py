"""The operator's commands as an operator runs them: hecate up, infer, status."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest

from hecate.bus.server import NatsServer
from tests.support.swarm import (
    EXAMPLES,
    SWARM_NODES,
    Processes,
    hecate_argv,
    infer_when_up,
    up_credentials,
)


def run(
    *args: str, timeout: float = 30, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*hecate_argv(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **env} if env else None,
    )


@pytest.mark.parametrize("secure", [False, True], ids=["open", "secure"])
def test_hecate_up_serves_and_stops_cleanly_on_ctrl_c(tmp_path: Path, secure: bool) -> None:
    state = tmp_path / "state"
    # Port 0: the gateway takes a free port as it binds and writes its URL down. A port
    # the test picked and let go could be taken meanwhile by whatever listens next (the
    # embedded NATS server once was, and the test spoke HTTP to it).
    up = subprocess.Popen(
        [
            *hecate_argv(),
            "up",
            "--topology",
            str(EXAMPLES / "swarm.json"),
            "--state",
            str(state),
            *(["--secure"] if secure else []),
            "--gateway",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url_file = state / "nats.url"
        answer = infer_when_up(
            state,
            "ncm-base",
            "hello from the cli",
            "--timeout",
            "2",
            within=30,
            user="tenant-a" if secure else None,
        )
        assert answer.returncode == 0, answer.stderr
        assert len(answer.stdout.split()) == 16
        assert "attempt(s)" in answer.stderr
        status = run(
            "status",
            "--nats",
            url_file.read_text().strip(),
            env=up_credentials(state, "operator") if secure else None,
        )
        assert status.returncode == 0, status.stderr
        assert "swarm: healthy" in status.stdout
        for node_id, *_ in SWARM_NODES:
            assert node_id in status.stdout
        assert "router router-1: snapshot fresh" in status.stdout
        assert "restarted:" not in status.stdout
        # A service that dies is started again, and hecate status says so.
        os.kill(child_of(up.pid, "router", "router-1"), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while "restarted: hecate-router router-1, 1 time" not in status.stdout:
            assert time.monotonic() < deadline, status.stdout
            time.sleep(0.5)
            status = run(
                "status",
                "--nats",
                url_file.read_text().strip(),
                env=up_credentials(state, "operator") if secure else None,
            )
        # The gateway it started answers over HTTP with the key it made (on the secure
        # bus too, as its own NATS user), and refuses a caller without one.
        key = (state / "gateway.key").read_text().strip()
        assert key not in (state / "gateway-keys.json").read_text()  # only its hash
        base = (state / "gateway.url").read_text().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:[1-9][0-9]*", base), base
        with httpx.Client(base_url=base, timeout=10) as http:
            body = {"model": "ncm-base", "prompt": "hello from the cli", "max_tokens": 16}
            ready = time.monotonic() + 30
            while http.get("/healthz/ready").status_code != 200:
                assert time.monotonic() < ready, http.get("/healthz/ready").text
                time.sleep(0.1)
            answer_http = http.post(
                "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            assert answer_http.status_code == 200, answer_http.text
            assert answer_http.json()["choices"][0]["text"] == answer.stdout.strip("\n")
            assert http.post("/v1/completions", json=body).status_code == 401
            models = http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert [m["id"] for m in models.json()["data"]] == ["ncm-base"]
        if secure:  # no credentials, no service
            anonymous = run(
                "infer", "ncm-base", "hi", "--nats", url_file.read_text().strip(), "--timeout", "2"
            )
            assert anonymous.returncode != 0
            assert "Traceback" not in anonymous.stderr
            log = (state / "nats" / "nats.log").read_text(errors="replace")
            assert "Violation" not in log, [ln for ln in log.splitlines() if "Violation" in ln]
            # Each node logged in as itself: no user speaks for every node.
            for node_id, *_ in SWARM_NODES:
                assert (state / "secure" / f"node-{node_id}.env").exists()
            assert not (state / "secure" / "node.env").exists()
            # The gateway, which asks as each tenant, holds the tenants' identities and
            # not one service's or node's password.
            given = gateway_identities(state)
            assert sorted(p.name for p in given.iterdir()) == ["tenant-a.env", "tenant-b.env"]
            for path in given.iterdir():
                assert "HECATE_NATS_USER=tenant-" in path.read_text()
    finally:
        up.send_signal(signal.SIGINT)  # what Ctrl-C does
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 0, out[-2000:]
    assert "Traceback" not in out, out[-3000:]
    assert "hecate up: NATS at nats://127.0.0.1:" in out
    assert f"OpenAI-compatible API at {base}/v1" in out
    assert not (state / "gateway.url").exists(), "the gateway removes its URL as it stops"
    assert (
        "secure bus (TLS, one user per role and per node, one account per tenant)" in out
    ) == secure
    assert re.search(r"node gpu \| stopped", out), "nodes drain and say so"
    assert "hecate up: router-1 exited (-9); starting it again in 1 s (restart 1)" in out
    assert "could not publish" not in out
    assert "will not be published" not in out
    assert not url_file.exists()
    if secure:  # the restart was published as the operator, who may
        log = (state / "nats" / "nats.log").read_text(errors="replace")
        assert "Violation" not in log, [ln for ln in log.splitlines() if "Violation" in ln]


def child_of(parent: int, *words: str) -> int:
    """The pid of ``parent``'s child whose command line holds each of ``words``."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            argv = (stat.parent / "cmdline").read_bytes().decode().split("\0")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == parent and all(w in argv for w in words):
            return int(stat.parent.name)
    raise AssertionError(f"no child of {parent} runs {words}")


def test_hecate_up_whose_gateway_cannot_listen_stops_and_says_why(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        up = subprocess.run(
            [
                *hecate_argv(),
                "up",
                "--topology",
                str(EXAMPLES / "swarm.json"),
                "--state",
                str(tmp_path / "state"),
                "--gateway",
                f"127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    out = up.stdout + up.stderr
    assert up.returncode == 2, out[-2000:]  # an error of the command, as a bad flag is
    assert f"cannot listen on 127.0.0.1:{port}" in out
    assert "the gateway exited (1) before listening" in out
    assert "OpenAI-compatible API at" not in out  # no banner naming an address nobody serves
    assert "Traceback" not in out, out[-3000:]


def gateway_identities(state: Path) -> Path:
    """The ``--tenant-identities`` directory of the gateway ``hecate up`` started for
    ``state``, read off its running process's command line."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if "gateway" in argv and "--tenant-identities" in argv:
            given = Path(argv[argv.index("--tenant-identities") + 1])
            if given.is_relative_to(state):
                return given
    raise AssertionError(f"no gateway of {state} with --tenant-identities is running")


def test_infer_reports_an_explicit_error_with_a_nonzero_exit(
    processes: Processes, nats_server: NatsServer
) -> None:
    processes.start("router-1", "router", "--id", "router-1")  # no plan at all
    deadline = time.monotonic() + 15
    while True:
        result = run("infer", "ncm-base", "anyone?", "--nats", nats_server.url, "--timeout", "2")
        if "no_plan" in result.stderr or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert result.returncode == 1
    assert "error no_plan" in result.stderr
    assert "Traceback" not in result.stderr


class _Collector(BaseHTTPRequestHandler):
    posts: ClassVar[list[tuple[str, str, int]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        _Collector.posts.append((self.path, self.headers.get("Content-Type", ""), len(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def otlp_endpoint() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Collector.posts = []
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_spans_are_exported_over_otlp_http_when_an_endpoint_is_set(
    processes: Processes,
    nats_server: NatsServer,
    otlp_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    import nats

    from tests.support.swarm import infer, start_swarm, wait_until_serving

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_endpoint)
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES)

    async def ask() -> None:
        nc = await nats.connect(nats_server.url)
        await wait_until_serving(nc, "ncm-base")
        assert (await infer(nc, "ncm-base", "traced")).ok
        await nc.close()

    asyncio.run(ask())
    processes.stop_all()  # services flush their spans when they stop
    paths = {(p, ctype) for p, ctype, size in _Collector.posts if size > 0}
    assert ("/v1/traces", "application/x-protobuf") in paths, _Collector.posts
