"""What the NATS server vouches for across accounts, on a real server: the ground the
tenant identities stand on.

A tenant account imports the swarm's ``hecate.infer.>`` (a streamed service) and
``hecate.cancel.>`` from the account the services live in. The server stamps every
request crossing the import with ``Nats-Request-Info`` naming the requesting account,
over whatever header the client sent; the responder answers, as many times as it
streams, on the reply subject the import mapped, which leads to the caller's own inbox
and nowhere else.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from hecate.bus.server import NatsServer
from hecate.bus.settle import settled

ACCOUNTS = """
accounts {
  SWARM: {
    users: [{
      user: router, password: r,
      permissions: {
        publish: { allow: ["_R_.>"] },
        subscribe: { allow: ["hecate.infer.>", "hecate.cancel.>"] }
      }
    }]
    exports: [
      { service: "hecate.infer.>", response_type: stream }
      { service: "hecate.cancel.>" }
    ]
  }
  TENANT_A: {
    users: [{ user: tenant-a, password: a }]
    imports: [
      { service: { account: SWARM, subject: "hecate.infer.>" } }
      { service: { account: SWARM, subject: "hecate.cancel.>" } }
    ]
  }
  TENANT_B: {
    users: [{ user: tenant-b, password: b }]
    imports: [{ service: { account: SWARM, subject: "hecate.infer.>" } }]
  }
}
"""


@pytest.fixture
def accounts_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "nats", jetstream=False, extra_config=ACCOUNTS).start()
    yield server
    server.stop()


def _url(server: NatsServer, user: str, password: str) -> str:
    return server.url.replace("nats://", f"nats://{user}:{password}@")


def _account(msg: Msg) -> str:
    return str(json.loads((msg.headers or {})["Nats-Request-Info"])["acc"])


async def test_the_server_names_the_requesting_account_and_streams_only_to_the_caller(
    accounts_server: NatsServer,
) -> None:
    router = await nats.connect(_url(accounts_server, "router", "r"))
    a = await nats.connect(_url(accounts_server, "tenant-a", "a"))
    b = await nats.connect(_url(accounts_server, "tenant-b", "b"))
    heard: list[tuple[str, str]] = []

    async def serve(msg: Msg) -> None:
        heard.append((msg.subject, _account(msg)))
        for token in (b"one", b"two", b"end"):
            await msg.respond(token)

    async def cancel(msg: Msg) -> None:
        heard.append((msg.subject, _account(msg)))

    try:
        await router.subscribe("hecate.infer.>", queue="routers", cb=serve)
        await router.subscribe("hecate.cancel.>", cb=cancel)
        await settled(router)

        # Tenant A claims to be B in the header the server writes: the server overwrites it.
        inbox, got, done = a.new_inbox(), [], asyncio.Event()

        async def on_token(msg: Msg) -> None:
            got.append(msg.data)
            if msg.data == b"end":
                done.set()

        await a.subscribe(inbox, cb=on_token)
        forged = {"Nats-Request-Info": json.dumps({"acc": "TENANT_B"})}
        await a.publish("hecate.infer.m", b"{}", reply=inbox, headers=forged)
        await asyncio.wait_for(done.wait(), 5)
        assert got == [b"one", b"two", b"end"]  # a stream, on the caller's own inbox

        # A fire-and-forget cancel crossing the import is stamped too.
        await a.publish("hecate.cancel.m", b"{}")
        await settled(a)
        first = await b.request("hecate.infer.m", b"{}", timeout=5)
        assert first.data == b"one"
        for _ in range(100):
            if len(heard) == 3:
                break
            await asyncio.sleep(0.02)
        assert sorted(heard) == [
            ("hecate.cancel.m", "TENANT_A"),
            ("hecate.infer.m", "TENANT_A"),
            ("hecate.infer.m", "TENANT_B"),
        ]
    finally:
        for nc in (router, a, b):
            await nc.close()


async def test_a_responder_without_the_reply_mapping_right_cannot_answer(tmp_path: Path) -> None:
    """Answering across the import is publishing to ``_R_.…``: a responder needs that
    right, and holds no other way to reach a tenant."""
    server = NatsServer(
        tmp_path / "narrow",
        jetstream=False,
        extra_config=ACCOUNTS.replace('publish: { allow: ["_R_.>"] }', 'publish: { allow: ["x"] }'),
    ).start()
    try:
        router = await nats.connect(_url(server, "router", "r"))
        a = await nats.connect(_url(server, "tenant-a", "a"))

        async def serve(msg: Msg) -> None:
            await msg.respond(b"answer")

        await router.subscribe("hecate.infer.>", cb=serve)
        await settled(router)
        with pytest.raises(nats.errors.TimeoutError):
            await a.request("hecate.infer.m", b"{}", timeout=1)
        await router.close()
        await a.close()
    finally:
        server.stop()
