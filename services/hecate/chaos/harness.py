"""A swarm of real processes for a chaos scenario: an embedded nats-server (restartable
on the same port, JetStream on disk), each service started with the very ``hecate``
command an operator types, logs in files, and the means to kill and restart any of them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from hecate.bus.server import NatsServer
from hecate.cli.up import hecate_command, node_env
from hecate.sim.topology import Topology, parse_topology

BREAKER_COOLDOWN_S = 2.0


@dataclass
class Swarm:
    workdir: Path
    topology_path: Path
    pipelines: int = 2
    routers: int = 2
    dispatch: str = "hop"
    server: NatsServer | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    argv: dict[str, list[str]] = field(default_factory=dict)

    @property
    def topology(self) -> Topology:
        return parse_topology(self.topology_path.read_bytes())

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    # -- the server ----------------------------------------------------------------------

    def start_server(self) -> None:
        port = self.server.client_port if self.server is not None else -1
        self.server = NatsServer(self.workdir / "nats", port=port).start()

    def kill_server(self) -> None:
        assert self.server is not None
        assert self.server.process is not None
        self.server.process.send_signal(signal.SIGKILL)
        self.server.process.wait(10)

    # -- services ------------------------------------------------------------------------

    def start(self, label: str, *args: str) -> None:
        self.argv[label] = list(args)
        self._spawn(label)

    def _spawn(self, label: str) -> None:
        log = (self.workdir / f"{label}.log").open("ab")
        env = node_env(dict(os.environ, HECATE_LOG_LEVEL="INFO"))
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        self.procs[label] = subprocess.Popen(
            [*hecate_command(), *self.argv[label], "--nats", self.url],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def kill(self, label: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[label]
        if proc.poll() is None:
            proc.send_signal(sig)
        proc.wait(15)

    def restart(self, label: str) -> None:
        if self.procs[label].poll() is None:
            self.kill(label, signal.SIGTERM)
        self._spawn(label)

    def start_all(self, *, router_args: tuple[str, ...] = ()) -> None:
        topo = self.topology
        self.start_server()
        self.start("telemetry", "telemetry", "--id", "telemetry")
        # Short cooldowns, so that a tripped circuit is probed and closes within a run.
        self.start(
            "breaker",
            "breaker",
            "--id",
            "breaker",
            "--failure-threshold",
            "3",
            "--cooldown-s",
            str(BREAKER_COOLDOWN_S),
        )
        self.start(
            "planner",
            "planner",
            "--id",
            "planner",
            "--topology",
            str(self.topology_path),
            "--pipelines",
            str(self.pipelines),
            "--settle-ms",
            "300",
        )
        for i in range(1, self.routers + 1):
            self.start(
                f"router-{i}",
                "router",
                "--id",
                f"router-{i}",
                "--topology",
                str(self.topology_path),
                "--stage-timeout-ms",
                "1500",
                "--dispatch",
                self.dispatch,
                *router_args,
            )
        for n in topo.nodes:
            extra = ["--executor", n.executor] if n.executor != "toy" else []
            self.start(
                f"node-{n.id}",
                "node",
                "--id",
                n.id,
                "--capacity-layers",
                str(n.capacity_layers),
                "--latency-ms",
                str(n.latency_ms),
                "--score",
                str(n.score),
                "--accept-faults",
                *extra,
            )

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.server is not None:
            self.server.stop()
