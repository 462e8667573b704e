"""Who may do what, enforced by a real nats-server running the permissions derived from
the wire contract (TLS on, one user per role and per tenant).

Each forbidden action is tried for real and must be refused by the server (a
permissions violation reported to the client, and nothing reaching a witness that is
allowed to listen); its allowed counterpart is tried the same way and must go through,
so a refusal is never an artefact of a broken setup. A whole swarm then runs on the
locked-down bus: every normal flow passes without a single violation, and tenants
cannot read each other's replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import nats
import pytest
from nats.aio.msg import Msg

from hecate.bus import kv as kvs
from hecate.bus.secure import SecureBus, make_certificates, prepare
from hecate.bus.server import NatsServer, server_binary
from hecate.bus.settle import settled
from hecate.wire import permissions, subjects
from tests.support.securebus import (
    Login,
    Session,
    delivered_on,
    refused_as,
    secure_server,
    sessions,
)
from tests.support.swarm import (
    EXAMPLES,
    SWARM_NODES,
    Processes,
    infer,
    start_swarm,
    wait_until_serving,
)
from tests.support.waits import planned

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def bus(tmp_path: Path) -> SecureBus:
    return prepare(tmp_path / "secure")


@pytest.fixture
def server(tmp_path: Path, bus: SecureBus) -> Iterator[NatsServer]:
    srv = secure_server(tmp_path / "nats", bus)
    yield srv
    srv.stop()


@pytest.fixture
async def login(server: NatsServer, bus: SecureBus) -> AsyncIterator[Login]:
    async with sessions(server.url, bus) as connect:
        yield connect


# (who, publishes to, a witness allowed to hear that subject)
FORBIDDEN_PUBLISH: list[tuple[str, str, str | None]] = [
    ("node-gpu", f"$KV.{subjects.PLAN_BUCKET}.{subjects.PLAN_KEY}", "router"),
    ("router", f"$KV.{subjects.PLAN_BUCKET}.{subjects.PLAN_KEY}", "router"),
    ("telemetry", f"$KV.{subjects.PLAN_BUCKET}.{subjects.PLAN_KEY}", "router"),
    ("router", f"$KV.{subjects.BREAKER_BUCKET}.gpu", "router"),
    ("planner", f"$KV.{subjects.BREAKER_BUCKET}.gpu", "router"),
    ("node-gpu", f"$KV.{subjects.TELEMETRY_BUCKET}.{subjects.telemetry_key(0)}", "router"),
    ("tenant-a", subjects.heartbeat("gpu"), "telemetry"),
    ("tenant-a", subjects.EVENT_FAILOVER, "operator"),
    ("tenant-a", subjects.EVENT_NODE_DOWN, "router"),
    ("tenant-a", subjects.node_join("gpu"), "planner"),
    ("tenant-a", subjects.node_run("gpu"), "node-gpu"),
    ("tenant-a", subjects.breaker_report("gpu"), "breaker"),
    ("tenant-a", subjects.BREAKER_PROBE, "breaker"),
    ("node-gpu", subjects.EVENT_PLAN, "operator"),
    ("node-gpu", subjects.infer("ncm-base"), "router"),
    ("operator", subjects.node_fault("gpu"), None),  # chaos runs only: nobody may
    ("router", subjects.heartbeat("gpu"), "telemetry"),
    # A node speaks for itself only.
    ("node-laptop", subjects.node_join("gpu"), "planner"),
    ("node-laptop", subjects.node_leave("gpu"), "planner"),
    ("node-laptop", subjects.node_leave("gpu"), "telemetry"),
    ("node-laptop", subjects.heartbeat("gpu"), "telemetry"),
]
# The same subjects, by the role the contract gives them to.
ALLOWED_PUBLISH = [
    ("telemetry", subjects.EVENT_NODE_DOWN, "router"),
    ("node-gpu", subjects.heartbeat("gpu"), "telemetry"),
    ("router", subjects.EVENT_FAILOVER, "operator"),
    ("node-gpu", subjects.node_join("gpu"), "planner"),
    ("node-gpu", subjects.node_leave("gpu"), "telemetry"),
    ("router", subjects.node_run("gpu"), "node-gpu"),
    ("node-laptop", subjects.node_run("gpu"), "node-gpu"),  # a chained stage
    ("router", subjects.breaker_report("gpu"), "breaker"),
    ("planner", subjects.EVENT_PLAN, "operator"),
    ("tenant-a", subjects.infer("ncm-base"), "router"),
]


async def _heard(witness: Session, subject: str, publisher: Session, *, within: float) -> bool:
    """Does ``witness`` hear what ``publisher`` sends to ``subject`` within ``within`` s?"""
    got = asyncio.Event()

    async def hear(_msg: Msg) -> None:
        got.set()

    sub = await witness.nc.subscribe(delivered_on(subject), cb=hear)
    await settled(witness.nc)
    deadline = asyncio.get_running_loop().time() + within
    while not got.is_set() and asyncio.get_running_loop().time() < deadline:
        await publisher.nc.publish(subject, b"{}")  # again every 0.25 s (a busy machine)
        await settled(publisher.nc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(got.wait(), 0.25)
    await sub.unsubscribe()
    return got.is_set()


@pytest.mark.parametrize(("user", "subject", "witness"), FORBIDDEN_PUBLISH)
async def test_a_forbidden_publish_is_refused_and_reaches_nobody(
    login: Login, user: str, subject: str, witness: str | None
) -> None:
    me = await login(user)
    if witness is None:
        await me.nc.publish(subject, b"{}")
    else:
        them = await login(witness)
        if subject.startswith("$KV."):  # KV values: the witness reads the bucket instead
            assert not await _kv_write(me, them, subject)
        else:
            assert not await _heard(them, subject, me, within=0.3)
        assert not them.errors
    message = await me.refused()
    assert refused_as(subject).search(message.lower()), message


@pytest.mark.parametrize(("user", "subject", "witness"), ALLOWED_PUBLISH)
async def test_the_role_the_contract_names_may_publish(
    login: Login, user: str, subject: str, witness: str
) -> None:
    me, them = await login(user), await login(witness)
    assert await _heard(them, subject, me, within=5.0), (user, subject, me.errors, them.errors)
    assert not me.errors
    assert not them.errors


async def _kv_write(me: Session, reader: Session, subject: str) -> bool:
    """Try to write a KV value as ``me``; True if ``reader`` then sees it."""
    _, bucket, key = subject.split(".", 2)
    await me.nc.publish(subject, b"forged")
    await settled(me.nc)
    await asyncio.sleep(0.15)
    kv = await asyncio.wait_for(kvs.wait_bucket(reader.nc, bucket), 5)
    try:
        entry = await kv.get(key)
    except Exception:
        return False
    return entry.value == b"forged"


@pytest.fixture(autouse=True)
async def _buckets(server: NatsServer, bus: SecureBus) -> None:
    """Each bucket created by its owner, as in a running swarm."""
    for owner, bucket in (
        ("planner", subjects.PLAN_BUCKET),
        ("telemetry", subjects.TELEMETRY_BUCKET),
        ("breaker", subjects.BREAKER_BUCKET),
    ):
        nc = await nats.connect(server.url, **bus.credentials(owner).options())
        await kvs.bucket(nc, bucket)
        await nc.close()


async def test_only_the_owner_creates_a_bucket(login: Login) -> None:
    node = await login("node-gpu")
    with pytest.raises(nats.errors.TimeoutError):  # refused: no reply
        await node.nc.jetstream(timeout=0.5).create_key_value(bucket="hecate-forged")
    assert "$js.api.stream.create.kv_hecate-forged" in (await node.refused()).lower()


@pytest.mark.parametrize(
    ("user", "subject"),
    [
        ("tenant-b", "_INBOX.tenant-a.>"),  # another tenant's replies
        ("tenant-b", "_INBOX.>"),
        ("tenant-b", subjects.INFER_ALL),  # other tenants' prompts
        ("tenant-b", subjects.EVENTS_ALL),
        ("node-gpu", subjects.INFER_ALL),
        ("node-gpu", "_INBOX.router.>"),  # routers' stage replies
        ("node-gpu", "_INBOX.node.laptop.>"),  # another node's replies
        ("node-gpu", subjects.node_run("laptop")),  # another node's stages
        ("node-gpu", subjects.NODE_JOIN_ALL),
        ("breaker", "_INBOX.tenant-a.>"),
        ("operator", "_INBOX.tenant-a.>"),
    ],
)
async def test_a_forbidden_subscription_is_refused(login: Login, user: str, subject: str) -> None:
    me = await login(user)
    await me.nc.subscribe(subject)
    message = await me.refused()
    assert f'subscription to "{subject.lower()}"' in message.lower(), message


async def test_a_swarm_runs_on_the_locked_down_bus_and_tenants_hear_only_their_replies(
    server: NatsServer, bus: SecureBus, tmp_path: Path, login: Login
) -> None:
    procs = Processes(url=server.url, logs=tmp_path, secure=bus)
    try:
        start_swarm(procs, EXAMPLES / "swarm.json", SWARM_NODES, routers=2, dispatch="chain")
        procs.start("breaker", "breaker", "--id", "breaker")
        a, b = await login("tenant-a"), await login("tenant-b")
        await wait_until_serving(a.nc, "ncm-base")
        await planned((await login("operator")).nc, "ncm-base", pipelines=2, routers=2)
        # Tenant b listens wherever it can; tenant a's answers never reach it.
        overheard: list[bytes] = []

        async def overhear(msg: Msg) -> None:
            overheard.append(msg.data)

        await b.nc.subscribe("_INBOX.tenant-a.>", cb=overhear)
        assert "_inbox.tenant-a.>" in (await b.refused()).lower()
        replies = await asyncio.gather(
            *(infer(a.nc, "ncm-base", f"tenant a {i}") for i in range(10)),
            *(infer(b.nc, "ncm-base", f"tenant b {i}") for i in range(10)),
        )
        assert all(r.ok for r in replies), [r.error for r in replies if not r.ok]
        # A node dies: failover events, breaker reports and re-routing all pass.
        procs.kill("node-gpu")
        after = [await infer(a.nc, "ncm-base", f"after {i}", timeout=10) for i in range(5)]
        assert all(r.ok for r in after), [r.error for r in after if not r.ok]
        assert not overheard
        assert not a.errors
    finally:
        procs.stop_all()
    # Not one refusal of a service's own traffic over the whole run.
    log = server.log_file.read_text(errors="replace")
    refused = [
        line for line in log.splitlines() if "Violation" in line and "user:tenant-b" not in line
    ]
    assert not refused, refused[:5]


def test_the_shipped_authorization_is_the_one_the_contract_gives() -> None:
    shipped = (REPO / "deploy" / "nats" / "auth.conf").read_text()
    assert shipped == permissions.render_authorization(), (
        "deploy/nats/auth.conf differs from the contract's permissions: regenerate it "
        "with `hecate nats-config > deploy/nats/auth.conf`"
    )
    accounts = (REPO / "deploy" / "nats" / "accounts.conf").read_text()
    assert accounts == permissions.render_accounts(), (
        "deploy/nats/accounts.conf differs from the contract's permissions: regenerate it "
        "with `hecate nats-config --accounts > deploy/nats/accounts.conf`"
    )


async def test_the_shipped_server_configuration_starts_and_serves_over_tls(
    tmp_path: Path,
) -> None:
    """deploy/nats/server.conf as shipped, but for its storage folder (and ports, on the
    command line): passwords and certificate paths from the environment, TLS required."""
    ca, cert, key = make_certificates(tmp_path)
    bus = prepare(tmp_path / "secure", tls=False)
    env = dict(os.environ, HECATE_TLS_CERT=str(cert), HECATE_TLS_KEY=str(key), **bus.server_env())
    shipped = (REPO / "deploy" / "nats" / "server.conf").read_text()
    assert shipped.count('store_dir: "/data"') == 1
    (tmp_path / "server.conf").write_text(shipped.replace('"/data"', f'"{tmp_path / "js"}"'))
    accounts = (REPO / "deploy" / "nats" / "accounts.conf").read_text()
    (tmp_path / "accounts.conf").write_text(accounts)
    proc = subprocess.Popen(
        [
            server_binary(),
            "-c",
            str(tmp_path / "server.conf"),
            "-a",
            "127.0.0.1",
            "-p",
            "-1",
            "-m",
            "-1",
            "--ports_file_dir",
            str(tmp_path),
            "-l",
            str(tmp_path / "nats.log"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port = await _client_port(tmp_path, proc)
        creds = bus.credentials("tenant-a")
        nc = await nats.connect(
            f"nats://127.0.0.1:{port}",
            **{**creds.options(), "tls": ssl.create_default_context(cafile=ca)},
        )
        assert nc.is_connected
        await nc.close()
        with pytest.raises((nats.errors.Error, OSError, TimeoutError)):  # plaintext: refused
            await nats.connect(
                f"nats://127.0.0.1:{port}",
                user="tenant-a",
                password=creds.password,
                connect_timeout=1,
                allow_reconnect=False,
                max_reconnect_attempts=0,
            )
    finally:
        proc.terminate()
        proc.wait(10)


async def _client_port(folder: Path, proc: subprocess.Popen[bytes]) -> int:
    for _ in range(500):
        assert proc.poll() is None, "nats-server exited: see its log in " + str(folder)
        for f in folder.glob("*.ports"):
            try:
                ports = msgspec.json.decode(f.read_bytes())
            except msgspec.DecodeError:
                continue
            found = re.search(r":(\d+)$", ports["nats"][0])
            assert found is not None
            return int(found.group(1))
        await asyncio.sleep(0.02)
    raise AssertionError("nats-server wrote no ports file")
