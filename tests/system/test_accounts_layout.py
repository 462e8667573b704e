"""The layout with one account per tenant, as rendered from the wire contract
(``SecureBus.server_config(layout="accounts")``, ``deploy/nats/accounts.conf``), on a
real server with TLS: the toy swarm runs with each service as its own user and routers
reading the tenant from the bus, and a tenant is who the server says, hears only its own
answers and reaches nothing but the services it imports.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import nats
import pytest
from nats.aio.msg import Msg

from hecate.bus import kv as kvs
from hecate.bus.secure import SecureBus, prepare
from hecate.bus.server import NatsServer
from hecate.bus.settle import settled
from hecate.bus.streamed import request_streamed
from hecate.wire import subjects
from hecate.wire.messages import (
    STREAM_TOKEN_HEADERS,
    InferReply,
    InferRequest,
    PlanValue,
    StreamToken,
)
from hecate_router.identity import REQUEST_INFO, Refused, tenant_of
from tests.support.securebus import Login, Session, everyone, secure_server, sessions
from tests.support.swarm import EXAMPLES, SWARM_NODES, Processes, start_swarm, wait_until_serving

MODEL = "ncm-base"
TOPOLOGY = EXAMPLES / "swarm.json"
_reply = msgspec.json.Decoder(InferReply)
_token = msgspec.json.Decoder(StreamToken)


@pytest.fixture
def bus(tmp_path: Path) -> SecureBus:
    return prepare(tmp_path / "secure", nodes=[n for n, *_ in SWARM_NODES])


@pytest.fixture
def server(tmp_path: Path, bus: SecureBus) -> Iterator[NatsServer]:
    srv = secure_server(tmp_path / "nats", bus, layout="accounts")
    yield srv
    srv.stop()


@pytest.fixture
def swarm(server: NatsServer, bus: SecureBus, tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(url=server.url, logs=tmp_path, secure=bus)
    start_swarm(procs, TOPOLOGY, SWARM_NODES, routers=0)
    procs.start(
        "router-1",
        "router",
        *("--id", "router-1", "--topology", str(TOPOLOGY), "--tenant-from", "bus"),
    )
    yield procs
    procs.stop_all()


@pytest.fixture
async def login(server: NatsServer, bus: SecureBus) -> AsyncIterator[Login]:
    async with sessions(server.url, bus) as connect:
        yield connect


async def _ask(session: Session, tenant: str) -> InferReply:
    body = msgspec.json.encode(InferRequest(prompt="hello", max_tokens=4, tenant=tenant))
    msg = await session.nc.request(subjects.infer(MODEL), body, timeout=10)
    return _reply.decode(msg.data)


@pytest.mark.usefixtures("swarm")
async def test_the_swarm_serves_each_tenant_as_the_server_names_it(
    server: NatsServer, bus: SecureBus, login: Login
) -> None:
    a = await login("tenant-a")
    await wait_until_serving(a.nc, MODEL)

    assert (await _ask(a, "tenant-a")).ok

    # Naming another tenant in the body is refused: the bus said who asked.
    refused = await _ask(a, "tenant-b")
    assert refused.error is not None
    assert refused.error.code == "forbidden"
    assert "'tenant-a'" in refused.error.message

    # A tenant hears nothing of the swarm's subjects nor another tenant's answers.
    for subject in ("hecate.>", "_INBOX.tenant-b.>"):
        await a.nc.subscribe(subject)
        assert f'subscription to "{subject.lower()}"' in (await a.refused()).lower()

    # The plan stays with the services: the operator reads it.
    operator = await login("operator")
    kv = await kvs.wait_bucket(operator.nc, subjects.PLAN_BUCKET)
    entry = await kv.get(subjects.PLAN_KEY)
    plan = msgspec.json.decode(entry.value or b"", type=PlanValue)
    assert plan.pipelines_of(MODEL)
    assert not operator.errors

    # Without credentials, no connection at all.
    with pytest.raises(nats.errors.Error, match=r"(?i)authorization"):
        await nats.connect(
            server.url,
            tls=ssl.create_default_context(cafile=str(bus.ca_file)),
            connect_timeout=2,
            allow_reconnect=False,
            max_reconnect_attempts=0,
        )

    # Not one refusal of the services' own traffic: the layout gives each what it needs.
    log = server.log_file.read_text(errors="replace")
    refused_lines = [
        line for line in log.splitlines() if "Violation" in line and "user:tenant-a" not in line
    ]
    assert not refused_lines, refused_lines[:5]


async def test_a_responder_streams_to_the_tenant_and_hears_its_cancels_stamped(
    login: Login,
) -> None:
    """What the toy swarm cannot show (its model streams no tokens): the rendered
    exports let a router answer a tenant many times on the tenant's own inbox, and a
    cancel reaches it stamped with the tenant's account."""
    router, a = await login("router"), await login("tenant-a")
    cancels: asyncio.Queue[str] = asyncio.Queue()

    async def serve(msg: Msg) -> None:
        for text in ("one", "two"):
            token = StreamToken(request_id="r", index=0, token=0, text=text)
            await router.nc.publish(
                msg.reply, msgspec.json.encode(token), headers=STREAM_TOKEN_HEADERS
            )
        await msg.respond(msgspec.json.encode(InferReply(ok=True, output="onetwo")))

    async def cancel(msg: Msg) -> None:
        await cancels.put(json.loads((msg.headers or {})[REQUEST_INFO])["acc"])

    await router.nc.subscribe(subjects.STREAM_ALL, cb=serve)
    await router.nc.subscribe(subjects.ROUTER_CANCEL, cb=cancel)
    await settled(router.nc)  # flush alone can return before the server has the SUBs
    tokens: list[str] = []

    async def on_token(msg: Msg) -> None:
        tokens.append(_token.decode(msg.data).text)

    msg = await request_streamed(a.nc, subjects.stream(MODEL), b"{}", timeout=5, on_token=on_token)
    assert _reply.decode(msg.data).output == "onetwo"
    assert tokens == ["one", "two"]
    await a.nc.publish(subjects.ROUTER_CANCEL, b"{}")
    assert await asyncio.wait_for(cancels.get(), 5) == "tenant-a"
    assert not router.errors
    assert not a.errors


async def test_only_a_tenant_s_own_account_is_taken_as_that_tenant(
    bus: SecureBus, login: Login
) -> None:
    """Every identity the layout creates sends, on each subject tenants send on, a body
    naming tenant-b and a forged stamp saying tenant-b; the routers' side hears what
    gets through. Only tenant-b's own messages read as tenant-b: another tenant's stamp
    is overwritten by the server (refused as a mismatch), and nobody in the services'
    account may publish there at all (its stamp would arrive as its publisher wrote
    it)."""
    router = await login("router")
    heard: asyncio.Queue[tuple[str, str, str | Refused]] = asyncio.Queue()

    async def hear(msg: Msg) -> None:
        sender, named = msg.data.decode().split(" ")
        taken = tenant_of("bus", msg.headers or {}, named)
        await heard.put((msg.subject, sender, taken))

    for subject in (subjects.INFER_ALL, subjects.STREAM_ALL, subjects.ROUTER_CANCEL):
        await router.nc.subscribe(subject, cb=hear)
    await settled(router.nc)
    forged = {REQUEST_INFO: json.dumps({"acc": "tenant-b"})}
    sent = (subjects.infer(MODEL), subjects.stream(MODEL), subjects.ROUTER_CANCEL)
    for user in everyone(bus):
        session = await login(user)
        for subject in sent:
            await session.nc.publish(subject, f"{user} tenant-b".encode(), headers=forged)
        await settled(session.nc)
    await settled(router.nc)

    taken_as_b: list[tuple[str, str]] = []
    got: set[tuple[str, str]] = set()
    while True:
        try:
            subject, sender, taken = await asyncio.wait_for(heard.get(), 1.0)
        except TimeoutError:
            break
        got.add((sender, subject))
        if taken == "tenant-b":
            taken_as_b.append((sender, subject))
    # tenant-b is heard on every subject, as itself: what the check reads gets through.
    assert sorted(taken_as_b) == sorted(("tenant-b", s) for s in sent)
    # Every other tenant is heard too, and refused: the server stamped its own account.
    assert {("tenant-a", s) for s in sent} <= got
    # Nothing from inside the services' account reaches the routers' subjects.
    assert {sender for sender, _ in got} == set(bus.tenants)
