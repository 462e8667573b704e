"""The configurations ``hecate bench bus`` compares, standing: an embedded nats-server
each, with a raw echo responder or a router and the nodes of a 1- or 3-stage pipeline
(the plan written to KV directly), optionally on a locked-down bus laid out as deployed;
and the closed loop that drives one (see :mod:`hecate_dev.bench.bus`)."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import nats

from hecate.bus.credentials import Credentials
from hecate.bus.secure import Layout, SecureBus, prepare
from hecate.bus.server import NatsServer
from hecate.core import ModelSpec, NodeProfile, Pipeline, Stage, SwarmPlan
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest
from hecate_launcher import ProcessSpec, Supervisor
from hecate_planner.planstore import publish_by_hand

ANONYMOUS = Credentials()

ECHO = """
import asyncio, sys, nats
try:
    import uvloop
    uvloop.install()
except ImportError:
    pass
async def main():
    nc = await nats.connect(sys.argv[1])
    async def echo(msg):
        await msg.respond(msg.data)
    await nc.subscribe("bench.echo", cb=echo)
    await nc.flush()
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def _drive(
    url: str,
    subject: str,
    body: bytes,
    inflight: int,
    seconds: float,
    check: bool,
    creds: Credentials = ANONYMOUS,
) -> dict[str, float]:
    nc = await nats.connect(url, **creds.options())
    latencies: list[float] = []
    failures = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal failures
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            try:
                msg = await nc.request(subject, body, timeout=5)
            except Exception:
                failures += 1
                continue
            if check and not _routed_ok(msg.data):
                failures += 1  # an error reply is not throughput
                continue
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    elapsed = time.perf_counter() - started
    await nc.close()
    latencies.sort()
    n = len(latencies)
    return {
        "rps": round(n / elapsed, 1),
        "p50_us": round(latencies[n // 2] * 1e6, 1) if n else 0.0,
        "p99_us": round(latencies[min(n - 1, int(n * 0.99))] * 1e6, 1) if n else 0.0,
        "requests": n,
        "failures": failures,
    }


async def wait_ready(
    url: str, subject: str, body: bytes, routed: bool, creds: Credentials = ANONYMOUS
) -> None:
    nc = await nats.connect(url, **creds.options())
    try:
        for _ in range(300):
            try:
                msg = await nc.request(subject, body, timeout=1)
                if not routed or msgspec.json.decode(msg.data, type=InferReply).ok:
                    return
            except Exception:
                pass
            await asyncio.sleep(0.05)
        raise RuntimeError(f"{subject} never answered")
    finally:
        await nc.close()


async def _write_plan(
    url: str, stages: int, layers: int, executor: str, creds: Credentials = ANONYMOUS
) -> None:
    """The benchmark's own plan: its model declares the executor its nodes run."""
    per = layers // stages
    nodes = tuple(
        NodeProfile(node_id=f"bench-{i}", capacity_layers=per, executor=executor)
        for i in range(stages)
    )
    plan = SwarmPlan(
        epoch=0,
        models=(ModelSpec(model_id="bench", layers=layers, executor=executor),),
        nodes=nodes,
        pipelines=(
            Pipeline(
                pipeline_id="bench-r0",
                model_id="bench",
                stages=tuple(
                    Stage(node_id=n.node_id, layer_start=i * per, layer_end=(i + 1) * per)
                    for i, n in enumerate(nodes)
                ),
            ),
        ),
    )
    nc = await nats.connect(url, **creds.options())
    await publish_by_hand(nc, plan)
    await nc.close()


CONFIGURATIONS = {  # label: (stages, dispatch); 0 stages is the raw echo
    "raw": (0, ""),
    "routed_1": (1, "hop"),
    "routed_3": (3, "hop"),
    "routed_3_chain": (3, "chain"),
    "routed_1_secure": (1, "hop"),
}
# On a locked-down bus as ``hecate up --secure`` and deploy/ run it: TLS, one account for
# the services and one per tenant (``SecureBus.server_config(layout="accounts")``), each
# service logged in as its role and each node as its own user, the router taking every
# request's tenant from the account the server stamps (``--tenant-from bus``), and the
# load sent by a tenant's user from its own account, through its import of the service.
SECURE = frozenset({"routed_1_secure"})
SECURE_LAYOUT: Layout = "accounts"
SECURE_TENANT = "tenant-a"


def _start(
    label: str,
    url: str,
    layers: int,
    executor: str,
    env: dict[str, str],
    bus: SecureBus | None = None,
) -> tuple[Supervisor, str, bytes, bool]:
    """The processes of one configuration; returns their supervisor, the subject to
    load, the request body and whether replies are routed ``InferReply``s."""
    stages, mode = CONFIGURATIONS[label]
    procs = Supervisor(env=env)
    if stages == 0:
        procs.start(ProcessSpec("echo", ("-c", ECHO, url), program=(sys.executable,)))
        return procs, "bench.echo", b"x" * 256, False
    asyncio.run(
        _write_plan(url, stages, layers, executor, bus.credentials("planner") if bus else ANONYMOUS)
    )
    vouched = ("--tenant-from", "bus") if bus else ()
    specs = [
        ProcessSpec("router", ("router", "--id", "bench-router", "--dispatch", mode, *vouched))
    ]
    specs += [
        ProcessSpec(
            f"node-{i}",
            (
                "node",
                "--id",
                f"bench-{i}",
                "--capacity-layers",
                str(layers // stages),
                "--executor",
                executor,
            ),
        )
        for i in range(stages)
    ]
    for spec in specs:
        creds = bus.service_credentials(spec.argv).to_env() if bus else {}
        procs.start(ProcessSpec(spec.label, (*spec.argv, "--nats", url), creds))
    body = msgspec.json.encode(InferRequest(prompt="bench", max_tokens=1))
    return procs, subjects.infer("bench"), body, True


@dataclass
class Standing:
    """One configuration standing: its server, its processes, what to send and as whom."""

    label: str
    server: NatsServer
    procs: Supervisor
    subject: str
    body: bytes
    routed: bool
    creds: Credentials

    @property
    def url(self) -> str:
        return self.server.url

    def roles(self) -> dict[str, list[int]]:
        """The pids of this configuration's processes by role (:data:`ROLES`, those it
        has: raw has no router, its echo counts as a node); the generator is this
        process, which drives the closed loop."""
        procs = self.procs.procs
        roles = {
            "server": [self.server.process.pid] if self.server.process else [],
            "router": [procs[label].pid for label in procs if label == "router"],
            "nodes": [procs[label].pid for label in procs if label != "router"],
            "generator": [os.getpid()],
        }
        return {role: pids for role, pids in roles.items() if pids}

    @classmethod
    def start(
        cls, label: str, tmp: Path, layers: int, executor: str, env: dict[str, str]
    ) -> Standing:
        stages = CONFIGURATIONS[label][0]
        nodes = [f"bench-{i}" for i in range(stages)]
        bus = prepare(tmp / label / "secure", nodes=nodes) if label in SECURE else None
        server = NatsServer(
            tmp / label,
            extra_config=bus.server_config(layout=SECURE_LAYOUT) if bus else "",
            env=bus.server_env() if bus else None,
        ).start()
        try:
            procs, subject, body, routed = _start(label, server.url, layers, executor, env, bus)
        except BaseException:
            server.stop()
            raise
        creds = bus.credentials(SECURE_TENANT) if bus else ANONYMOUS
        return cls(label, server, procs, subject, body, routed, creds)

    async def drive(self, inflight: int, seconds: float) -> dict[str, Any]:
        """The closed loop against this configuration, with the CPU each role spent
        per correct reply (``cpu_us``, see :func:`cpu_per_reply`)."""
        roles = self.roles()
        before = cpu_by_role(roles)
        figures: dict[str, Any] = await _drive(
            self.url, self.subject, self.body, inflight, seconds, self.routed, self.creds
        )
        figures["cpu_us"] = cpu_per_reply(before, cpu_by_role(roles), int(figures["requests"]))
        return figures

    def stop(self) -> None:
        self.procs.stop()
        self.server.stop()


# Who spends CPU on a request: the nats-server, the router, the nodes (together; the
# echo responder for raw) and the generator (the process driving the closed loop).
ROLES = ("server", "router", "nodes", "generator")


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time a process has used so far (Linux ``/proc``); ``None``
    where that cannot be read (another system, a process gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the name, in parentheses, may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_role(roles: Mapping[str, list[int]]) -> dict[str, float | None]:
    """Each role's CPU seconds so far, its processes summed; ``None`` if one is unreadable."""
    out: dict[str, float | None] = {}
    for role, pids in roles.items():
        times = [cpu_seconds(pid) for pid in pids]
        out[role] = None if not times or None in times else sum(t for t in times if t)
    return out


def cpu_per_reply(
    before: Mapping[str, float | None], after: Mapping[str, float | None], replies: int
) -> dict[str, float]:
    """Microseconds of CPU each role spent per correct reply between two readings of
    :func:`cpu_by_role`, and their ``total``; roles that could not be read are left out
    (and so is the total). Empty when nothing was answered."""
    if replies <= 0:
        return {}
    out: dict[str, float] = {}
    for role, start in before.items():
        end = after.get(role)
        if start is not None and end is not None:
            out[role] = round((end - start) / replies * 1e6, 1)
    if out and len(out) == len(before):
        out["total"] = round(sum(out.values()), 1)
    return out


def median_costs(rounds: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each role's median CPU per reply over the rounds that measured it."""
    roles = {role for costs in rounds for role in costs}
    return {
        role: round(statistics.median(c[role] for c in rounds if role in c), 1)
        for role in sorted(roles)
    }


def _routed_ok(data: bytes) -> bool:
    try:
        return msgspec.json.decode(data, type=InferReply).ok
    except msgspec.DecodeError:
        return False
