"""Hosts apart on one machine: each a Linux network namespace on a bridge of its own.

A swarm's processes on one machine share its loopback: nothing is ever really cut off,
and a "partition" is a proxy's say-so. Here each host (a NATS server, the services, a
rack of nodes) is a namespace with its own interfaces, addresses and ports, joined to
the others by a veth pair into one bridge, as machines on a switch: cutting a host off
is taking its cable out (its veth down), and ``tc tbf`` on its cable limits its
bandwidth. The kernel here has no netem: latency comes from the fault proxy
(:mod:`hecate_dev.chaos.proxy`), not from here.

The bridge has an address of its own (``.1``), so this process, in the root namespace,
reaches every host directly. Everything made is removed on :meth:`Hosts.close` (and at
exit): namespaces, links, the bridge.

:class:`NatsHost` runs a nats-server inside a host: a member of a cluster (routes to its
peers, JetStream, a leaf-node port) or a leaf node of one (a volunteer machine's own
server, joining the swarm through the cluster's leaf port).

Needs root (``CAP_NET_ADMIN``) and iproute2; :func:`unavailable` says why not.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hecate.bus.children import spawn
from hecate.bus.server import server_binary
from hecate.wire import subjects
from hecate_launcher import ProcessSpec
from hecate_launcher.supervisor import hecate_command

NET = "10.231"  # each bridge a /24 of it (by its tag): .1 the bridge itself, hosts from .2
CLIENT_PORT, CLUSTER_PORT, LEAF_PORT, MONITOR_PORT = 4222, 6222, 7422, 8222
_RUNS = itertools.count()  # the bridges this process made: each its own tag
DOMAIN = "hub"  # the cluster's JetStream domain, as its leaf nodes name it


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can)."""
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root (CAP_NET_ADMIN)"
    probe = f"hx-probe-{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    """One namespace: ``ip`` its address on the bridge, ``cable`` its veth's root end."""

    name: str
    ns: str
    ip: str
    cable: str

    def program(self) -> tuple[str, ...]:
        """The ``hecate`` command, run inside this host (a :class:`ProcessSpec` program)."""
        return ("ip", "netns", "exec", self.ns, *hecate_command())

    def spec(self, label: str, *argv: str, env: dict[str, str] | None = None) -> ProcessSpec:
        """``hecate <argv>`` in this host, for a supervisor."""
        return ProcessSpec(label, argv, env=env or {}, program=self.program())

    def popen(self, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Any program in this host (dies with this process, as every child here)."""
        return spawn(["ip", "netns", "exec", self.ns, *argv], **kwargs)

    def cut(self) -> None:
        """Take its cable out: nothing reaches it, nothing leaves it; its processes run on."""
        _ip("link", "set", self.cable, "down")

    def heal(self) -> None:
        _ip("link", "set", self.cable, "up")

    def limit(self, rate: str, *, burst: str = "32kb", latency: str = "400ms") -> None:
        """Bandwidth both ways (``rate`` as tc writes it: ``10mbit``): a token bucket on
        each end of its cable."""
        bucket = ("root", "tbf", "rate", rate, "burst", burst, "latency", latency)
        for where, dev in (((), self.cable), (("ip", "netns", "exec", self.ns), "eth0")):
            qdisc = [*where, "tc", "qdisc", "replace", "dev", dev, *bucket]
            subprocess.run(qdisc, check=True, capture_output=True)


@dataclass
class Hosts:
    """Namespaces on one bridge. ``tag`` keeps the names of two runs apart."""

    tag: str = field(default_factory=lambda: f"{os.getpid() % 1000:03d}{next(_RUNS) % 100:02d}")
    hosts: dict[str, Host] = field(default_factory=dict)
    bridge: str = ""
    net: str = ""

    def __post_init__(self) -> None:
        while _ip("link", "show", f"hx{self.tag}br", check=False).returncode == 0:
            self.tag = f"{self.tag[:3]}{next(_RUNS) % 100:02d}"  # another run's: not ours
        self.bridge = f"hx{self.tag}br"
        self.net = f"{NET}.{int(self.tag) % 250}"  # two runs at once: two subnets
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.net}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        atexit.register(self.close)

    def add(self, name: str) -> Host:
        index = len(self.hosts)
        if index > 250:
            raise ValueError("at most 251 hosts on one bridge")
        ns = f"hx-{self.tag}-{name}"
        cable, inner = f"hx{self.tag}c{index}", f"hx{self.tag}i{index}"
        ip = f"{self.net}.{index + 2}"
        _ip("netns", "add", ns)
        _ip("link", "add", cable, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", ns)
        _ip("link", "set", cable, "master", self.bridge)
        _ip("link", "set", cable, "up")
        inside = ("-n", ns)
        _ip(*inside, "link", "set", inner, "name", "eth0")
        _ip(*inside, "addr", "add", f"{ip}/24", "dev", "eth0")
        _ip(*inside, "link", "set", "eth0", "up")
        _ip(*inside, "link", "set", "lo", "up")
        host = Host(name, ns, ip, cable)
        self.hosts[name] = host
        return host

    def close(self) -> None:
        for host in self.hosts.values():
            _ip("netns", "del", host.ns, check=False)  # takes its veth pair with it
        self.hosts.clear()
        if self.bridge:
            _ip("link", "del", self.bridge, check=False)
            self.bridge = ""

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NatsHost:
    """A nats-server inside ``host``: a cluster member when ``peers`` are given (routes
    to each, JetStream, a leaf-node port), a leaf node of the cluster when ``hub`` is
    (its own server for the processes of its host, no JetStream: the hub's serves it)."""

    def __init__(
        self,
        host: Host,
        workdir: Path,
        *,
        peers: Sequence[str] = (),
        hub: Sequence[str] = (),
    ) -> None:
        self.host = host
        self.dir = workdir / f"nats-{host.name}"
        self.dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"server_name: {host.name}",
            f"listen: 0.0.0.0:{CLIENT_PORT}",
            f"http: 0.0.0.0:{MONITOR_PORT}",
            "max_payload: 1MB",
            subjects.render_mappings(),
        ]
        if peers:
            routes = ", ".join(f'"nats://{p}:{CLUSTER_PORT}"' for p in peers)
            lines += [
                f'jetstream {{ store_dir: "{self.dir / "js"}", domain: {DOMAIN} }}',
                f"cluster {{ name: hecate, listen: 0.0.0.0:{CLUSTER_PORT}, routes: [{routes}] }}",
                f"leafnodes {{ listen: 0.0.0.0:{LEAF_PORT} }}",
            ]
        if hub:
            urls = ", ".join(f'"nats-leaf://{h}:{LEAF_PORT}"' for h in hub)
            lines.append(f"leafnodes {{ remotes: [ {{ urls: [{urls}] }} ] }}")
            # The hub's JetStream, for this host's clients as if it were local: their
            # API requests go to the hub's domain, across the leaf connection.
            lines.append(f'mappings {{ "$JS.API.>": "$JS.{DOMAIN}.API.>" }}')
        self.hub = tuple(hub)
        config = self.dir / "nats.conf"
        config.write_text("\n".join(lines) + "\n")
        self.process = host.popen(
            [server_binary(), "--config", str(config), "--log", str(self.dir / "nats.log")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    @property
    def url(self) -> str:
        return f"nats://{self.host.ip}:{CLIENT_PORT}"

    @property
    def log(self) -> str:
        return (self.dir / "nats.log").read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> NatsHost:
        """Until its health check passes (a member's, once JetStream is current with the
        cluster's elected meta leader; a leaf's, once its connection to the hub is up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server in {self.host.name} exited: {self.log[-2000:]}")
            try:
                url = f"http://{self.host.ip}:{MONITOR_PORT}/healthz"
                with urllib.request.urlopen(url, timeout=0.5) as resp:
                    if resp.status == 200 and (not self.hub or self._leaf_up()):
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"nats-server in {self.host.name} not ready after {timeout}s")

    def _leaf_up(self) -> bool:
        """Whether its connection to the hub is up."""
        url = f"http://{self.host.ip}:{MONITOR_PORT}/leafz"
        with urllib.request.urlopen(url, timeout=0.5) as resp:
            return bool(json.loads(resp.read()).get("leafnodes", 0))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
