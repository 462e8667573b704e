"""Nodes speak for themselves only, on a real server.

On the locked-down bus each node is a NATS user of its own: node laptop's join, leave or
heartbeat as gpu is refused by the server and never arrives. A node that sends on its
own subject a body naming another node gets past the server, and the planner and
telemetry refuse it instead: counted, logged once with both ids, and the plan and
liveness are as they were. On an open bus a sender that waits for a reply is told why
(``forbidden``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client

from hecate.bus import kv as kvs
from hecate.bus import telemetry
from hecate.bus.secure import SecureBus, prepare
from hecate.bus.server import NatsServer
from hecate.bus.settle import settled
from hecate.core import NodeProfile
from hecate.wire import subjects
from hecate.wire.messages import ErrorReply, Heartbeat, NodeJoin, NodeLeave
from tests.support.securebus import refused_as, secure_server, sessions
from tests.support.swarm import EXAMPLES, SWARM_NODES, Processes
from tests.support.waits import endpoint_data, listening, stats, until

TOPOLOGY = EXAMPLES / "swarm.json"


@pytest.fixture
def bus(tmp_path: Path) -> SecureBus:
    return prepare(tmp_path / "secure", nodes=[n for n, *_ in SWARM_NODES])


@pytest.fixture
def server(tmp_path: Path, bus: SecureBus) -> Iterator[NatsServer]:
    srv = secure_server(tmp_path / "nats", bus)
    yield srv
    srv.stop()


def _services(procs: Processes, *, nodes: bool) -> None:
    procs.start("telemetry", "telemetry", "--id", "telemetry")
    procs.start(
        "planner", "planner", "--id", "planner", "--topology", str(TOPOLOGY), "--settle-ms", "300"
    )
    if nodes:
        for node_id, capacity, latency, score in SWARM_NODES:
            procs.node(node_id, capacity, latency, score)


async def _planner(client: Client) -> dict[str, Any]:
    return endpoint_data(await stats(client, "planner", "planner"), "join") or {}


async def _telemetry(client: Client) -> dict[str, Any]:
    return endpoint_data(await stats(client, "telemetry", "telemetry"), "heartbeat") or {}


async def _alive(client: Client) -> dict[str, bool]:
    kv = await kvs.wait_bucket(client, subjects.TELEMETRY_BUCKET)
    snapshot = await telemetry.read(kv)
    return {node_id: n.alive for node_id, n in snapshot.nodes.items()} if snapshot else {}


def _refusals(log: str, subject_node: str, body_node: str) -> int:
    """How many times a service's log says it refused ``body_node`` on
    ``subject_node``'s subject."""
    count = 0
    for line in log.splitlines():
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            count += (doc.get("event"), doc.get("subject_node"), doc.get("body_node")) == (
                "refused: node identity",
                subject_node,
                body_node,
            )
    return count


async def test_a_node_cannot_join_leave_or_heartbeat_as_another(
    server: NatsServer, bus: SecureBus, tmp_path: Path
) -> None:
    procs = Processes(url=server.url, logs=tmp_path, secure=bus)
    try:
        _services(procs, nodes=True)
        async with sessions(server.url, bus) as login:
            op = (await login("operator")).nc
            node = await login("node-laptop")
            laptop, refused = node.nc, node.errors

            async def planned() -> bool:
                p = await _planner(op)
                return p.get("members") == 4 and p.get("epoch", 0) >= 1 and not p["pending"]

            await until(planned, "the planner planning the four nodes")
            await until(lambda: _all_alive(op), "telemetry hearing the four nodes", poll_s=0.1)
            before = await _planner(op)

            # As another node: the server refuses, nothing arrives.
            forged: list[tuple[str, msgspec.Struct]] = [
                (subjects.node_leave("gpu"), NodeLeave(node_id="gpu")),
                (
                    subjects.node_join("gpu"),
                    NodeJoin(profile=NodeProfile(node_id="gpu", capacity_layers=1)),
                ),
                (
                    subjects.heartbeat("gpu"),
                    Heartbeat(node_id="gpu", seq=0, sent_at=0.0, interval_ms=100.0, draining=True),
                ),
            ]
            for subject, body in forged:
                await laptop.publish(subject, msgspec.json.encode(body))
                await settled(laptop)
                await until(lambda: bool(refused), f"the server refusing {subject}")
                assert refused_as(subject).search(refused.pop(0).lower())

            # On its own subject, naming another: refused by the services instead.
            own: list[tuple[str, msgspec.Struct]] = [
                (subjects.node_leave("laptop"), NodeLeave(node_id="gpu")),
                (subjects.node_leave("laptop"), NodeLeave(node_id="gpu")),  # logged once
                (
                    subjects.node_join("laptop"),
                    NodeJoin(profile=NodeProfile(node_id="gpu", capacity_layers=1)),
                ),
                (
                    subjects.heartbeat("laptop"),
                    Heartbeat(node_id="ghost", seq=0, sent_at=0.0, interval_ms=100.0),
                ),
            ]
            for subject, body in own:
                await laptop.publish(subject, msgspec.json.encode(body))
            await settled(laptop)
            assert not refused

            async def counted() -> bool:
                p, t = await _planner(op), await _telemetry(op)
                return p.get("identity_mismatch") == 3 and t.get("identity_mismatch") == 3

            await until(counted, "the planner and telemetry refusing the mismatches")
            after = await _planner(op)
            assert (after["members"], after["epoch"], after["plan"]) == (
                before["members"],
                before["epoch"],
                before["plan"],
            )
            alive = await _alive(op)
            assert alive == {n: True for n, *_ in SWARM_NODES}, alive  # no ghost, gpu up
            assert _refusals(procs.log("planner"), "laptop", "gpu") == 1
            assert _refusals(procs.log("telemetry"), "laptop", "gpu") == 1
            assert _refusals(procs.log("telemetry"), "laptop", "ghost") == 1
    finally:
        procs.stop_all()
    log = server.log_file.read_text(errors="replace")
    violations = [line for line in log.splitlines() if "Violation" in line]
    assert violations  # the three forgeries
    assert all("user:node-laptop" in line for line in violations), violations[:5]


async def _all_alive(client: Client) -> bool:
    try:
        alive = await _alive(client)
    except Exception:  # no snapshot yet
        return False
    return alive == {n: True for n, *_ in SWARM_NODES}


_error = msgspec.json.Decoder(ErrorReply)


@pytest.mark.parametrize(
    ("service", "subject", "body"),
    [
        (
            "planner",
            subjects.node_join("laptop"),
            NodeJoin(profile=NodeProfile(node_id="gpu", capacity_layers=4)),
        ),
        ("planner", subjects.node_leave("laptop"), NodeLeave(node_id="gpu")),
        ("telemetry", subjects.node_leave("laptop"), NodeLeave(node_id="gpu")),
        (
            "telemetry",
            subjects.heartbeat("laptop"),
            Heartbeat(node_id="gpu", seq=0, sent_at=0.0, interval_ms=100.0),
        ),
    ],
)
async def test_a_mismatch_with_a_reply_subject_is_answered_forbidden(
    processes: Processes, client: Client, service: str, subject: str, body: msgspec.Struct
) -> None:
    _services(processes, nodes=False)
    endpoint = "heartbeat" if subject.startswith("hecate.telemetry") else subject.split(".")[-1]
    await listening(client, service, service, endpoint)
    reply = await client.request(subject, msgspec.json.encode(body), timeout=10)
    assert reply.headers is not None
    assert reply.headers["Hecate-Error"] == "forbidden"
    error = _error.decode(reply.data).error
    assert error.code == "forbidden"
    assert "'laptop'" in error.message
    assert "'gpu'" in error.message
    read: Callable[[Client], Any] = _planner if service == "planner" else _telemetry
    assert (await read(client))["identity_mismatch"] == 1
