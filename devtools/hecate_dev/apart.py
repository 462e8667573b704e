"""A toy swarm on hosts apart (:mod:`hecate_dev.hosts`), and a load that checks its answers.

:class:`ApartSwarm`: a NATS cluster of three servers, each on a host of its own; the
services (telemetry, planner, breaker, routers) on a host of their own; racks of nodes
(``hecate node-host``), each rack a host; and, optionally, a far host whose nodes join
through a NATS leaf node of their own, as a volunteer machine would. Every process
connects to the cluster as a separate machine would, by address, and a rack cut off is
a cable pulled (:meth:`hecate_dev.hosts.Host.cut`).

:class:`Load`: requests to the swarm's model, a few at a time, each answer checked
against the single-process answer; failures and wrong answers counted, never retried
by the load itself (the router's retries are the swarm's own).

Used by ``tests/system/test_hosts_apart.py`` and the scale suite's cut-off
(:func:`hecate_dev.bench.scale.cut_off`).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import msgspec
from nats.aio.client import Client

from hecate.bus import kv as kvs
from hecate.bus import telemetry as telemetry_kv
from hecate.core import SwarmPlan
from hecate.model.toy import reference
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest
from hecate_dev.hosts import Host, Hosts, NatsHost
from hecate_launcher import Supervisor
from hecate_node.host import identities

LAYERS_PER_NODE = 8
_reply = msgspec.json.Decoder(InferReply)


class ApartSwarm:
    """``racks`` node counts, one host each (node ids ``r<i>-<n>``); ``far`` nodes on a
    host joining through its own leaf node (ids ``far-<n>``); a model of ``layers``
    layers on nodes of 8. ``shards`` telemetry replicas, ``routers`` routers, each
    started with ``router_args`` too, and the planner with ``planner_args``."""

    def __init__(
        self,
        tmp: Path,
        racks: list[int],
        *,
        far: int = 0,
        layers: int = 24,
        model: str = "apart",
        heartbeat_ms: int = 100,
        routers: int = 1,
        shards: int = 1,
        start_per_s: float = 200.0,
        log_level: str = "INFO",
        router_args: tuple[str, ...] = (),
        planner_args: tuple[str, ...] = (),
    ) -> None:
        self.model, self.layers = model, layers
        self.routers = routers  # labelled router-0, router-1, ...
        self.router_args, self.planner_args = router_args, planner_args
        self.hosts = Hosts()
        env = {**os.environ, "HECATE_LOG_LEVEL": log_level}
        (tmp / "logs").mkdir(parents=True, exist_ok=True)
        self.procs = Supervisor(env=env, logs=tmp / "logs")
        self.servers: list[NatsHost] = []
        self.leaf: NatsHost | None = None
        try:
            self._start(tmp, racks, far, heartbeat_ms, routers, shards, start_per_s)
        except BaseException:
            self.close()
            raise

    def _start(
        self,
        tmp: Path,
        racks: list[int],
        far: int,
        heartbeat_ms: int,
        routers: int,
        shards: int,
        start_per_s: float,
    ) -> None:
        h = self.hosts
        core = [h.add(n) for n in ("core-a", "core-b", "core-c")]
        self.ctl = h.add("ctl")
        self.racks: list[Host] = [h.add(f"rack-{i}") for i in range(len(racks))]
        self.far = h.add("far") if far else None
        peers = [c.ip for c in core]
        self.servers = [NatsHost(c, tmp, peers=[p for p in peers if p != c.ip]) for c in core]
        if self.far is not None:
            self.leaf = NatsHost(self.far, tmp, hub=peers)
        for server in self.all_servers:
            server.wait_ready(60)
        urls = [s.url for s in self.servers]
        cluster = ",".join(urls)
        topology = tmp / "topology.json"
        nodes = [{"id": "x", "capacity_layers": LAYERS_PER_NODE}]
        topology.write_text(
            json.dumps({"models": [{"id": self.model, "layers": self.layers}], "nodes": nodes})
        )
        ctl, start = self.ctl, self.procs.start
        for k in range(shards):
            sharded = ("--shards", str(shards), "--shard", str(k))
            label = f"telemetry-{k}"
            start(ctl.spec(label, "telemetry", "--id", label, *sharded, "--nats", cluster))
        for r in range(routers):
            label = f"router-{r}"
            start(ctl.spec(label, "router", "--id", label, *self.router_args, "--nats", cluster))
        start(ctl.spec("breaker", "breaker", "--id", "breaker", "--nats", cluster))
        node: tuple[str, ...] = ("--capacity-layers", str(LAYERS_PER_NODE))
        node += ("--heartbeat-ms", str(heartbeat_ms), "--start-per-s", str(start_per_s))
        for i, (rack, count) in enumerate(zip(self.racks, racks, strict=True)):
            ids = ("--prefix", f"r{i}-", "--count", str(count))
            # Each rack on one server of the cluster, as machines spread over it.
            start(rack.spec(rack.name, "node-host", *ids, *node, "--nats", urls[i % 3]))
        if self.far is not None and self.leaf is not None:
            ids = ("--prefix", "far-", "--count", str(far))
            start(self.far.spec("far", "node-host", *ids, *node, "--nats", self.leaf.url))
        plan: tuple[str, ...] = ("--topology", str(topology), "--pipelines", "auto")
        plan += ("--settle-ms", "500")
        plan += self.planner_args
        # The planner at INFO whatever the rest: its "plan published" records are read.
        info = {"HECATE_LOG_LEVEL": "INFO"}
        start(ctl.spec("planner", "planner", "--id", "planner", *plan, "--nats", cluster, env=info))
        self.url = urls[2]  # for this process's own clients

    @property
    def all_servers(self) -> list[NatsHost]:
        return [*self.servers, *([self.leaf] if self.leaf is not None else [])]

    def rack_nodes(self, i: int, count: int) -> set[str]:
        """The ids of rack ``i``'s ``count`` nodes, as its node host names them."""
        return set(identities(f"r{i}-", count))

    def far_nodes(self, count: int) -> set[str]:
        return set(identities("far-", count))

    def close(self) -> None:
        self.procs.stop()
        for server in self.all_servers:
            server.stop()
        self.hosts.close()


async def plan_of(client: Client) -> SwarmPlan | None:
    try:
        bucket = await kvs.bucket(client, subjects.PLAN_BUCKET)
        value, _ = await kvs.get(bucket, subjects.PLAN_KEY)
    except Exception:  # not there yet, or the server busy: ask again
        return None
    return msgspec.json.decode(value, type=SwarmPlan) if value else None


async def plan_nodes(client: Client) -> set[str]:
    plan = await plan_of(client)
    return {n.node_id for n in plan.nodes} if plan is not None else set()


async def alive(client: Client) -> set[str]:
    try:
        kv = await kvs.bucket(client, subjects.TELEMETRY_BUCKET)
        snap = await telemetry_kv.read(kv, nc=client, listen_s=0.3)
    except Exception:  # not there yet, or the server busy: ask again
        return set()
    return {n for n, t in snap.nodes.items() if t.alive} if snap else set()


class Load:
    """Requests ``at_once`` at a time, each answer checked."""

    def __init__(
        self, client: Client, model: str, layers: int, *, at_once: int = 4, timeout_s: float = 15
    ) -> None:
        self.client, self.model, self.layers = client, model, layers
        self.at_once, self.timeout_s = at_once, timeout_s
        self.answered = self.wrong = self.failed = 0
        self.errors: list[str] = []
        self.latencies: list[float] = []
        self._expected: dict[str, str] = {}

    async def one(self, i: int) -> None:
        prompt = f"request {i % 64}"
        body = msgspec.json.encode(InferRequest(prompt=prompt, max_tokens=4))
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            msg = await self.client.request(
                subjects.infer(self.model), body, timeout=self.timeout_s
            )
        except Exception as exc:
            self.failed += 1
            self.errors.append(f"{exc!r} at {loop.time():.3f}")
            return
        reply = _reply.decode(msg.data)
        if prompt not in self._expected:
            self._expected[prompt] = reference(self.model, self.layers, prompt, 4)
        if not reply.ok:
            self.failed += 1
            self.errors.append(f"{reply.error}")
        elif reply.output != self._expected[prompt]:
            self.wrong += 1
        else:
            self.answered += 1
            self.latencies.append(loop.time() - started)

    async def run(self, stop: asyncio.Event) -> None:
        i = 0
        while not stop.is_set():
            await asyncio.gather(*(self.one(i + k) for k in range(self.at_once)))
            i += self.at_once
