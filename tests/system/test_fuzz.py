"""Bad input on every subject a service listens on, against a running swarm.

hypothesis draws the corpus: random bytes, JSON and msgpack of arbitrary shapes,
objects with the right field names and wrong values, huge strings, payloads over the
size limit, and garbage trace headers. Each is sent to every subject; where a reply is
expected it must be a typed error (``ok`` false, a code and a message) or a valid
answer, within the timeout. Afterwards every service is still up and answers $SRV.PING,
none has grown past a memory bound, no log holds a stack trace, each kind of rejection
is logged once (the counters carry the rest), and a good request is still served.

Twice: on the open bus, anonymously, and on a locked-down one (TLS, an account per
tenant, each service and node its own user, the router taking tenants from the bus),
where each subject is fuzzed by the least trusted user the contract lets publish on it
(a tenant through its account's import, a node as itself, the router, ...), and every
other user is refused by the server before any service sees the message.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.client import Client

from hecate.bus.secure import SecureBus, prepare
from hecate.bus.server import NatsServer
from hecate.bus.settle import settled
from hecate.model.toy import reference
from hecate.wire import subjects
from hecate_router.identity import REQUEST_INFO
from tests.support.securebus import (
    Login,
    Session,
    everyone,
    publishers,
    refused_as,
    secure_server,
    sessions,
    start_accounts_swarm,
)
from tests.support.swarm import (
    EXAMPLES,
    SWARM_NODES,
    Processes,
    infer,
    start_swarm,
    wait_until_serving,
)

FIELDS = [
    "prompt", "max_tokens", "tenant", "request_id", "model_id", "layer_start", "layer_end",
    "activation", "node_id", "seq", "target", "ok", "code", "tokens", "messages", "stop",
    "profile", "capacity_layers", "chain", "session", "position", "attempt", "quota_ticket",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)
lookalikes = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6)


def _json(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


# Requests that decode, so the identity, retry and routing rules behind parsing see
# them too: a tenant named or not, its own or another's, a request_id seen before.
requests = st.fixed_dictionaries(
    {"prompt": st.text(max_size=20)},
    optional={
        "tenant": st.sampled_from(["", "default", "tenant-a", "tenant-b", "HECATE"])
        | st.text(max_size=10),
        "request_id": st.sampled_from(["", "r1", "r2"]),
        "max_tokens": st.integers(min_value=0, max_value=16),
        "attempt": st.integers(min_value=1, max_value=3),
    },
)
payloads = st.one_of(
    st.binary(max_size=512),
    json_values.map(_json),
    lookalikes.map(_json),
    requests.map(_json),
    lookalikes.map(lambda v: msgspec.msgpack.encode(v) if _finite(v) else b"\xc1"),
    st.just(b"{" * 10_000),
    st.just(_json({"prompt": "x" * 300_000})),  # over the router's request limit
    st.just(b"\x00" * 2_000_000),  # over the server's max_payload: refused by NATS itself
)
headers = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"traceparent": st.text(max_size=80), "tracestate": st.text(max_size=80)}
    ),
    # What the server stamps on a request crossing an import, forged by the sender.
    st.fixed_dictionaries(
        {REQUEST_INFO: st.sampled_from(['{"acc":"tenant-b"}', '{"acc":"HECATE"}', "{"])}
    ),
)


def _finite(value: Any) -> bool:
    try:
        msgspec.msgpack.encode(value)
        return True
    except (TypeError, OverflowError, ValueError):
        return False


def _corpus(n: int) -> list[tuple[bytes, dict[str, str] | None]]:
    drawn: list[tuple[bytes, dict[str, str] | None]] = []

    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(payloads, headers)
    def draw(payload: bytes, header: dict[str, str] | None) -> None:
        drawn.append((payload, header))

    draw()
    return drawn


# Subjects that answer (request/reply) and those that only listen.
REQUEST_REPLY = [
    subjects.infer("ncm-base"),
    subjects.infer("no-such-model"),
    "hecate.infer.Not_A-slug!",
    subjects.stream("ncm-base"),
    "hecate.stream.Not_A-slug!",
    subjects.node_run("gpu"),
    subjects.QUOTA_ACQUIRE,
    subjects.BREAKER_PROBE,
    subjects.ROUTER_RETRIES,
]
LISTEN_ONLY = [
    subjects.heartbeat("gpu"),
    subjects.heartbeat("nobody"),
    subjects.node_join("gpu"),
    subjects.node_join("nobody"),
    subjects.node_leave("gpu"),
    subjects.node_leave("nobody"),
    subjects.NODE_ROLL_CALL,
    subjects.breaker_report("gpu"),
    subjects.EVENT_NODE_DOWN,
    subjects.ROUTER_CANCEL,
    subjects.node_release("gpu"),
]
# Who fuzzes each subject on the locked-down bus, as derived from the contract (the
# least trusted user allowed to publish on it): pinned here, so that a permission
# widened to a less trusted user fails this test instead of quietly fuzzing as it.
SECURE_SENDERS: dict[str, str | None] = {
    subjects.infer("ncm-base"): "tenant-a",
    subjects.infer("no-such-model"): "tenant-a",
    "hecate.infer.Not_A-slug!": "tenant-a",
    subjects.stream("ncm-base"): "tenant-a",
    "hecate.stream.Not_A-slug!": "tenant-a",
    subjects.node_run("gpu"): "router",
    subjects.QUOTA_ACQUIRE: "router",
    subjects.BREAKER_PROBE: "router",
    subjects.ROUTER_RETRIES: "router",
    subjects.heartbeat("gpu"): "node-gpu",
    subjects.heartbeat("nobody"): None,
    subjects.node_join("gpu"): "node-gpu",
    subjects.node_join("nobody"): None,
    subjects.node_leave("gpu"): "node-gpu",
    subjects.node_leave("nobody"): None,
    subjects.NODE_ROLL_CALL: "planner",
    subjects.breaker_report("gpu"): "router",
    subjects.EVENT_NODE_DOWN: "telemetry",
    subjects.ROUTER_CANCEL: "tenant-a",
    subjects.node_release("gpu"): "router",
}
SERVICES = ["telemetry", "planner", "breaker", "router-1", *[f"node-{n}" for n, *_ in SWARM_NODES]]


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


TOPOLOGY = EXAMPLES / "swarm.json"
ANYONE = "anyone"  # on the open bus everyone is one anonymous client
TENANT, OPERATOR = "tenant-a", "operator"


@dataclass
class Swarm:
    """The toy swarm and its breaker, running, and who speaks to it."""

    procs: Processes
    server: NatsServer
    secure: SecureBus | None  # None: the open bus
    login: Login

    def sender(self, subject: str) -> str | None:
        """Who fuzzes ``subject``: on the locked-down bus the least trusted user allowed
        to publish on it (None: nobody is)."""
        if self.secure is None:
            return ANYONE
        allowed = publishers(self.secure, subject, layout="accounts")
        return allowed[0] if allowed else None

    def role(self, user: str) -> str:
        return ANYONE if self.secure is None else user


@pytest.fixture(params=["open", "secure"])
async def swarm(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Swarm]:
    secure = None
    if request.param == "secure":
        secure = prepare(tmp_path / "secure", nodes=[n for n, *_ in SWARM_NODES])
        server = secure_server(tmp_path / "nats", secure, layout="accounts")
    else:
        server = NatsServer(tmp_path / "nats").start()
    procs = Processes(url=server.url, logs=tmp_path, secure=secure)
    try:
        if secure is None:
            start_swarm(procs, TOPOLOGY, SWARM_NODES)
        else:
            start_accounts_swarm(procs, TOPOLOGY, SWARM_NODES)
        procs.start("breaker", "breaker", "--id", "breaker")
        if secure is not None:
            async with sessions(server.url, secure) as login:
                yield Swarm(procs, server, secure, login)
        else:
            anonymous = Session(await nats.connect(server.url), [])
            try:

                async def same(_user: str) -> Session:
                    return anonymous

                yield Swarm(procs, server, None, same)
            finally:
                await anonymous.nc.close()
    finally:
        procs.stop_all()
        server.stop()


async def test_every_subject_survives_bad_input_and_answers_typed_errors(swarm: Swarm) -> None:
    processes = swarm.procs
    users: dict[str, Session] = {}

    async def session(user: str) -> Session:
        if user not in users:
            users[user] = await swarm.login(user)
        return users[user]

    if swarm.secure is not None:
        senders = {s: swarm.sender(s) for s in (*REQUEST_REPLY, *LISTEN_ONLY)}
        assert senders == SECURE_SENDERS
    tenant = await session(swarm.role(TENANT))
    await wait_until_serving(tenant.nc, "ncm-base")
    corpus = _corpus(150)
    rss_before = {label: _rss_kb(processes.procs[label].pid) for label in SERVICES}

    for subject in REQUEST_REPLY:
        sender = swarm.sender(subject)
        assert sender is not None, f"nobody may ask on {subject}"
        nc = (await session(sender)).nc
        for payload, header in corpus:
            if len(payload) > 1024 * 1024:
                continue  # the server refuses it before any service sees it (below)
            msg = await nc.request(subject, payload, timeout=5, headers=header)
            try:
                body = msgspec.json.decode(msg.data)
            except msgspec.DecodeError:
                body = msgspec.msgpack.decode(msg.data)
            if isinstance(body, dict) and body.get("ok") is False:
                error = body["error"]
                assert error["code"], (subject, sender, body)
                assert error["message"], (subject, sender, body)
                assert "Traceback" not in error["message"]
                assert msg.headers is not None
                assert msg.headers.get("Hecate-Error") == error["code"]
    for subject in LISTEN_ONLY:
        sender = swarm.sender(subject)
        if sender is None:
            continue  # nobody may publish there: refused below
        nc = (await session(sender)).nc
        for payload, header in corpus:
            if len(payload) <= 1024 * 1024:
                await nc.publish(subject, payload, headers=header)
        await settled(nc)
    # Over the server's max_payload, NATS itself refuses (the publisher gets an error).
    with pytest.raises(Exception, match=r"(?i)payload"):
        await tenant.nc.publish(subjects.infer("ncm-base"), b"\x00" * 2_000_000)
    refused: set[tuple[str, str]] = set()
    if swarm.secure is not None:
        refused = await _everyone_else_is_refused(swarm.secure, session)
    await asyncio.sleep(1.0)

    # Everyone is still up and answering.
    for label in SERVICES:
        assert processes.procs[label].poll() is None, (
            f"{label} died: {processes.log(label)[-2000:]}"
        )
    pings = await _pings((await session(swarm.role(OPERATOR))).nc)
    assert len(pings) >= len(SERVICES), pings
    # Memory stayed bounded (no corpus kept, no unbounded queues).
    for label, before in rss_before.items():
        after = _rss_kb(processes.procs[label].pid)
        assert after < before + 64 * 1024, (label, before, after)
    # No stack trace in any log; each kind of rejection logged once per endpoint.
    for label in SERVICES:
        log = processes.log(label)
        assert "Traceback" not in log, (label, log[-3000:])
        rejections = [json.loads(line) for line in log.splitlines() if '"request rejected"' in line]
        kinds = [(r.get("endpoint"), r.get("code")) for r in rejections]
        assert len(kinds) == len(set(kinds)), (label, kinds)
    # And a good request is still served, right.
    reply = await infer(tenant.nc, "ncm-base", "still there?")
    assert reply.ok, reply.error
    assert reply.output == reference("ncm-base", 12, "still there?", 8)
    if swarm.secure is not None:
        # What the server refused is what was sent to be refused: no service's answer
        # to a fuzzer, nor anything else the swarm sent, fell outside what it is granted.
        log = swarm.server.log_file.read_text(errors="replace")
        violations = [line for line in log.splitlines() if "Violation" in line]
        assert len(violations) == len(refused), violations[:5]
        for line in violations:
            who = re.search(r'user:([^"]+)".*Publish Violation.*Subject "([^"]+)"', line)
            assert who is not None, line
            assert who.groups() in refused, line


async def _everyone_else_is_refused(
    bus: SecureBus, session: Callable[[str], Awaitable[Session]]
) -> set[tuple[str, str]]:
    """Each fuzzed subject, sent by every user the contract does not let publish on it
    (a tenant on a node's heartbeat, a node as another node, the router on a tenant's
    inference subject, anyone as a node that does not exist): the server refuses each
    with a permissions violation, so no service ever sees it. Returns the pairs of user
    and subject refused (the subject the server checked)."""
    out: set[tuple[str, str]] = set()
    for user in everyone(bus):
        s = await session(user)
        banned = [
            subject
            for subject in (*REQUEST_REPLY, *LISTEN_ONLY)
            if user not in publishers(bus, subject, layout="accounts")
        ]
        for subject in banned:
            await s.nc.publish(subject, b"{}", reply=s.nc.new_inbox())
        await settled(s.nc)
        refused = [await s.refused(timeout=5.0) for _ in banned]
        assert not s.errors, (user, s.errors)
        for subject, error in zip(banned, refused, strict=True):
            named = refused_as(subject).search(error)
            assert named is not None, (user, subject, error)
            # As the server logs it: the subject sent (the client lowers the case of the
            # error it reports), or the one it maps to in an account that maps it.
            checked = named.group(1)
            out.add((user, subject if checked == subject.lower() else checked))
    return out


async def _pings(client: Client) -> list[bytes]:
    inbox = client.new_inbox()
    got: list[bytes] = []

    async def on_pong(msg: Any) -> None:
        got.append(msg.data)

    sub = await client.subscribe(inbox, cb=on_pong)
    await client.publish("$SRV.PING", b"", reply=inbox)
    await asyncio.sleep(0.5)
    await sub.unsubscribe()
    return got
