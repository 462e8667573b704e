"""The router reads a request's tenant from the account the bus vouches for
(``hecate router --tenant-from bus``), on a real server with one account per tenant.

The services share one account; each tenant's account imports ``hecate.infer.>`` and
``hecate.router.cancel`` from it, so the server stamps every request and cancel with the
tenant's account (tests/shared/bus/test_bus_identity.py shows the server side).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.bus.server import NatsServer
from hecate.bus.settle import settled
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest
from tests.support.gateways import gateway_port
from tests.support.swarm import EXAMPLES, SWARM_NODES, Processes, start_swarm
from tests.support.waits import GENEROUS_S, listening
from tests.system.test_gateway import api_key

ACCOUNTS = """
accounts {
  SWARM: {
    jetstream: enabled
    users: [{ user: svc, password: s }]
    exports: [
      { service: "hecate.infer.>", response_type: stream }
      { service: "hecate.router.cancel" }
    ]
  }
  tenant-a: {
    users: [{ user: tenant-a, password: a }]
    imports: [
      { service: { account: SWARM, subject: "hecate.infer.>" } }
      { service: { account: SWARM, subject: "hecate.router.cancel" } }
    ]
  }
  tenant-b: {
    users: [{ user: tenant-b, password: b }]
    imports: [
      { service: { account: SWARM, subject: "hecate.infer.>" } }
      { service: { account: SWARM, subject: "hecate.router.cancel" } }
    ]
  }
}
"""
MODEL = "ncm-base"
_reply = msgspec.json.Decoder(InferReply)


def _url(server: NatsServer, user: str, password: str) -> str:
    return server.url.replace("nats://", f"nats://{user}:{password}@")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServer]:
    srv = NatsServer(tmp_path / "nats", extra_config=ACCOUNTS).start()
    yield srv
    srv.stop()


@pytest.fixture
def swarm(server: NatsServer, tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(url=_url(server, "svc", "s"), logs=tmp_path)
    start_swarm(procs, EXAMPLES / "swarm.json", SWARM_NODES, routers=0)
    procs.start("router-1", "router", "--id", "router-1", "--tenant-from", "bus")
    yield procs
    procs.stop_all()


@pytest.fixture
async def tenants(server: NatsServer) -> AsyncIterator[tuple[Client, Client, Client]]:
    a = await nats.connect(_url(server, "tenant-a", "a"))
    b = await nats.connect(_url(server, "tenant-b", "b"))
    svc = await nats.connect(_url(server, "svc", "s"))
    yield a, b, svc
    for nc in (a, b, svc):
        await nc.close()


async def _ask(nc: Client, tenant: str = "default", request_id: str = "") -> InferReply:
    body = InferRequest(prompt="hello", max_tokens=4, tenant=tenant, request_id=request_id)
    msg = await nc.request(subjects.infer(MODEL), msgspec.json.encode(body), timeout=10)
    return _reply.decode(msg.data)


async def _serving(nc: Client) -> InferReply:
    for _ in range(200):
        try:
            reply = await _ask(nc)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            reply = None
        if reply is not None and reply.ok:
            return reply
        await asyncio.sleep(0.1)
    raise AssertionError("the swarm never answered tenant a")


async def _counters(svc: Client) -> dict[str, int]:
    msg = await svc.request("$SRV.STATS.hecate-router", b"", timeout=2)
    data = next(e["data"] for e in json.loads(msg.data)["endpoints"] if e["name"] == "infer")
    return dict(data["counters"])


async def test_a_tenant_is_who_the_bus_says_and_cannot_speak_for_another(
    swarm: Processes, tenants: tuple[Client, Client, Client]
) -> None:
    a, b, svc = tenants
    await _serving(a)

    # Naming itself, or nobody, is fine; naming another tenant is refused.
    assert (await _ask(a, tenant="tenant-a")).ok
    refused = await _ask(a, tenant="tenant-b")
    assert not refused.ok
    assert refused.error is not None
    assert refused.error.code == "forbidden"
    assert "'tenant-b'" in refused.error.message
    assert "'tenant-a'" in refused.error.message

    # A request cannot make the router publish where it likes. The old ``stream_to``
    # field is ignored (tokens come back only on the caller's own reply subject), and
    # a reply subject naming a services' subject is mapped back into the caller's own
    # account by the server: nothing reaches the services' account.
    spied: list[bytes] = []

    async def spy(msg: Msg) -> None:
        spied.append(msg.data)

    await svc.subscribe(subjects.EVENT_FAILOVER, cb=spy)
    await settled(svc)
    deputy = {"prompt": "hello", "max_tokens": 4, "stream": True}
    deputy["stream_to"] = subjects.EVENT_FAILOVER
    answered = (await _counters(svc)).get("answered", 0)
    msg = await a.request(subjects.infer(MODEL), json.dumps(deputy).encode(), timeout=10)
    assert _reply.decode(msg.data).ok
    await a.publish(
        subjects.infer(MODEL), json.dumps(deputy).encode(), reply=subjects.EVENT_FAILOVER
    )
    for _ in range(200):  # until the router has answered both
        if (await _counters(svc)).get("answered", 0) >= answered + 2:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the router never answered the redirected request")
    await settled(svc)
    assert spied == []

    # A request the server vouched for no tenant (from inside the services' account).
    inside = await _ask(svc)
    assert inside.error is not None
    assert inside.error.code == "forbidden"

    # B replaying A's request_id is B's own request, not A's remembered answer.
    first = await _ask(a, request_id="shared-id")
    assert first.ok
    before = (await _counters(svc)).get("retries_answered_again", 0)
    assert (await _ask(b, request_id="shared-id")).ok
    assert (await _counters(svc)).get("retries_answered_again", 0) == before
    assert (await _ask(a, request_id="shared-id")).ok  # A's own retry is remembered
    assert (await _counters(svc)).get("retries_answered_again", 0) == before + 1
    assert (await _counters(svc))["forbidden"] == 2
    assert "refused: tenant" in swarm.log("router-1")


async def test_the_gateway_asks_as_each_keys_tenant_with_that_tenants_identity(
    swarm: Processes, tenants: tuple[Client, Client, Client], tmp_path: Path
) -> None:
    a, _b, _svc = tenants
    await _serving(a)
    identities = tmp_path / "identities"
    identities.mkdir()
    (identities / "tenant-a.env").write_text(
        "export HECATE_NATS_USER=tenant-a\nexport HECATE_NATS_PASSWORD=a\n"
    )
    keyfile = tmp_path / "keys.json"
    key_a, key_c = api_key(keyfile, "tenant-a"), api_key(keyfile, "tenant-c")
    swarm.start(
        "gateway",
        "gateway",
        *("--keys", str(keyfile), "--port", "0", "--tenant-identities", str(identities)),
    )
    base = f"http://127.0.0.1:{gateway_port(swarm)}/v1"
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 4}
    async with httpx.AsyncClient(timeout=30) as http:
        ok = await http.post(
            f"{base}/completions", json=body, headers={"authorization": f"Bearer {key_a}"}
        )
        assert ok.status_code == 200, ok.text
        assert ok.json()["choices"][0]["text"]
        # A key whose tenant the gateway holds no identity for cannot ask at all.
        none = await http.post(
            f"{base}/completions", json=body, headers={"authorization": f"Bearer {key_c}"}
        )
    assert none.status_code == 403, none.text
    assert "no bus identity for tenant 'tenant-c'" in none.text
    # The router was asked as tenant-a by the bus, and refused nobody.
    assert "forbidden" not in await _counters(_svc)


@pytest.fixture
def quota_swarm(server: NatsServer, tmp_path: Path) -> Iterator[Processes]:
    """tenant-b may ask once a minute; tenant-a has no quota."""
    quotas = tmp_path / "quotas.json"
    quotas.write_text(json.dumps({"tenants": {"tenant-b": {"requests_per_min": 1, "burst": 1}}}))
    procs = Processes(url=_url(server, "svc", "s"), logs=tmp_path)
    procs.start("breaker", "breaker", "--id", "breaker", "--quotas", str(quotas))
    start_swarm(procs, EXAMPLES / "swarm.json", SWARM_NODES, routers=0)
    procs.start(
        "router-1",
        "router",
        *("--id", "router-1", "--tenant-from", "bus", "--enforce-quotas"),
        # Served unchecked only if the desk is silent this long: never, in this test.
        *("--quota-timeout-ms", str(int(GENEROUS_S * 1000))),
    )
    yield procs
    procs.stop_all()


async def test_a_tenant_cannot_spend_another_tenants_quota(
    quota_swarm: Processes, tenants: tuple[Client, Client, Client]
) -> None:
    a, b, svc = tenants
    await listening(svc, "breaker", "breaker", "quota")
    await _serving(a)
    # A asking in B's name is refused before the quota desk is asked ...
    for _ in range(3):
        refused = await _ask(a, tenant="tenant-b")
        assert refused.error is not None
        assert refused.error.code == "forbidden"
    # ... and A's own requests are A's (no quota), however many.
    for _ in range(3):
        assert (await _ask(a)).ok
    # So B's one request a minute is still there for B, and only once.
    assert (await _ask(b)).ok
    limited = await _ask(b)
    assert limited.error is not None
    assert limited.error.code == "rate_limited"
    assert (await _counters(svc))["forbidden"] == 3
    assert "refused: tenant" in quota_swarm.log("router-1")
