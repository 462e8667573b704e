"""A swarm of real processes for a chaos scenario: an embedded nats-server (restartable
on the same port, JetStream on disk) or a cluster of three, and each service started by
the one supervisor (:class:`hecate_launcher.Supervisor`) with the very ``hecate`` command
an operator types, logs in files, so that any of them can be killed and restarted.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Collection
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from hecate.bus.server import NatsServer
from hecate.sim.topology import Topology, parse_topology
from hecate_dev.chaos.proxy import FaultProxy, ProxyThread
from hecate_launcher import ProcessSpec, Supervisor, node_argv, node_env, spawn

BREAKER_COOLDOWN_S = 2.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Swarm:
    workdir: Path
    topology_path: Path
    pipelines: int = 2
    routers: int = 2
    dispatch: str = "hop"
    cluster: int = 1  # nats-servers: 1, or 3 routed together (JetStream replicated)
    servers: list[NatsServer] = field(default_factory=list)
    # Labels (or fnmatch patterns: "node-*") of the processes started behind a fault
    # proxy of their own (proxy.py).
    proxied: Collection[str] = frozenset()
    proxies: dict[str, FaultProxy] = field(default_factory=dict, init=False)
    # The proxies a fronted cluster's routes go through, by (from, to) server index.
    route_proxies: dict[tuple[int, int], FaultProxy] = field(default_factory=dict, init=False)
    supervisor: Supervisor = field(init=False)
    _proxy_thread: ProxyThread | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        env = node_env(dict(os.environ, HECATE_LOG_LEVEL="INFO"))
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        self.supervisor = Supervisor(env=env, logs=self.workdir)

    @property
    def procs(self) -> dict[str, subprocess.Popen[bytes]]:
        return self.supervisor.procs

    @property
    def topology(self) -> Topology:
        return parse_topology(self.topology_path.read_bytes())

    @property
    def url(self) -> str:
        """Every server, comma-separated (what ``--nats`` takes)."""
        return ",".join(self.server_urls)

    @property
    def server_urls(self) -> list[str]:
        """Where a client reaches each server: its front proxy where it has one."""
        return [
            self.proxies[f"nats-{i}"].url if f"nats-{i}" in self.proxies else s.url
            for i, s in enumerate(self.servers)
        ]

    def _url_for(self, label: str) -> str:
        """Every server, starting at a different one per process: connections spread
        over a cluster, and each client can still reach the others."""
        urls = self.server_urls
        k = sum(label.encode()) % len(urls)
        return ",".join(urls[k:] + urls[:k])

    def nats_for(self, label: str) -> str:
        """What ``label`` is given as ``--nats``: its servers, or its proxy to them (one
        URL: the proxy tries the servers in that order for each connection)."""
        if not self._proxied(label):
            return self._url_for(label)
        if label not in self.proxies:
            upstreams = [int(u.rsplit(":", 1)[1]) for u in self._url_for(label).split(",")]
            self.proxies[label] = self._start_proxy(label, upstreams)
        return self.proxies[label].url

    def _proxied(self, label: str) -> bool:
        return any(fnmatch(label, pattern) for pattern in self.proxied)

    def _start_proxy(self, label: str, ports: list[int]) -> FaultProxy:
        if self._proxy_thread is None:
            self._proxy_thread = ProxyThread()
        seed = sum(label.encode())  # the same jitter draws on every run
        return self._proxy_thread.start_proxy([("127.0.0.1", p) for p in ports], seed=seed)

    def proxy(self, label: str) -> FaultProxy:
        """The fault proxy in front of ``label`` (one of ``proxied``, started; a fronted
        server's is ``nats-<i>``)."""
        return self.proxies[label]

    # -- servers -------------------------------------------------------------------------

    def start_servers(self) -> None:
        if self.cluster == 1:
            self.servers = [NatsServer(self.workdir / "nats", popen=spawn).start()]
            return
        n = self.cluster
        routes = [_free_port() for _ in range(n)]
        clients = [_free_port() for _ in range(n)]
        # A server proxied as "nats-<i>" is fronted: its clients reach it through a proxy
        # of its own (``proxy("nats-<i>")``), and each route to or from it through one per
        # (from, to) pair (``route_proxies``), so that a scenario can cut it off from its
        # peers and its clients, as a partition does.
        fronted = {i for i in range(n) if self._proxied(f"nats-{i}")}
        for i in sorted(fronted):
            self.proxies[f"nats-{i}"] = self._start_proxy(f"nats-{i}", [clients[i]])
        for i in range(n):
            for j in range(n):
                if i != j and {i, j} & fronted:
                    label = f"route-{i}-{j}"
                    self.route_proxies[(i, j)] = self._start_proxy(label, [routes[j]])

        def route(i: int, j: int) -> str:
            port = self.route_proxies[(i, j)].port if (i, j) in self.route_proxies else routes[j]
            return f"nats://127.0.0.1:{port}"

        # A server tells its clients its peers' URLs, and nats-py would reconnect to them
        # directly, round a proxied process's proxy: with proxies, the servers keep quiet.
        quiet = ("--no_advertise=true",) if self.proxied else ()
        # A server also tells its peers its cluster address, and one that has no route to
        # it yet dials that address directly, round the route's proxy; with fronted
        # servers, the address told is a closed port, and only the configured routes,
        # through their proxies, ever connect.
        unheard = ("--cluster_advertise", f"127.0.0.1:{_free_port()}") if fronted else ()
        self.servers = [
            NatsServer(
                self.workdir / f"nats-{i}",
                port=clients[i],
                extra_args=(
                    "--server_name", f"hecate-{i}",
                    "--cluster_name", "hecate",
                    "--cluster", f"nats://127.0.0.1:{routes[i]}",
                    "--routes", ",".join(route(i, j) for j in range(n) if j != i),
                    *quiet,
                    *unheard,
                ),
                popen=spawn,
            )
            for i in range(n)
        ]  # fmt: skip
        for server in self.servers:
            server.launch()
        for server in self.servers:
            server.wait_ready(30)

    def kill_server(self, index: int = 0) -> None:
        process = self.servers[index].process
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def start_server(self, index: int = 0) -> None:
        """Start server ``index`` again, on its ports and with its JetStream store."""
        old = self.servers[index]
        new = NatsServer(
            old.state_dir, port=old.client_port, extra_args=old.extra_args, popen=spawn
        )
        self.servers[index] = new.start(30)

    # -- services ------------------------------------------------------------------------

    def start(self, label: str, *args: str) -> None:
        self.supervisor.start(ProcessSpec(label, (*args, "--nats", self.nats_for(label))))

    def kill(self, label: str, sig: int = signal.SIGKILL, *, wait: bool = True) -> None:
        """Send ``sig`` to a service; ``wait``: until it has exited (not for a signal
        that only freezes it, such as SIGSTOP)."""
        self.supervisor.kill(label, sig, wait=wait)

    def restart(self, label: str) -> None:
        self.supervisor.restart(label)

    def start_services(self, *, router_args: tuple[str, ...] = ()) -> None:
        topo = self.topology
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
            self.start(f"node-{n.id}", *node_argv(n), "--accept-faults")

    def stop_all(self) -> None:
        self.supervisor.stop()
        if self._proxy_thread is not None:
            self._proxy_thread.stop()
        for server in self.servers:
            server.stop()
