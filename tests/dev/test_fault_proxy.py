"""The fault proxy between a nats-py client and a real nats-server: requests through it,
and each fault as the client meets it (hecate_dev.chaos.proxy)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout

from hecate.bus.server import NatsServer
from hecate.bus.settle import settled
from hecate_dev.chaos.harness import Swarm
from hecate_dev.chaos.proxy import Direction, FaultProxy, ProxyThread


class Watched:
    """A client through the proxy, and what it noticed of its connection."""

    def __init__(self) -> None:
        self.nc = Client()  # replaced by the connected one
        self.disconnects = 0
        self.reconnected = asyncio.Event()

    async def connect(self, url: str) -> Client:
        async def on_disconnect() -> None:
            self.disconnects += 1

        async def on_reconnect() -> None:
            self.reconnected.set()

        async def quiet(_exc: Exception) -> None:
            pass

        self.nc = await nats.connect(
            [url],
            # Pings alone would take 30 s to call a silent link dead: longer than any
            # blackhole here, so the connection is judged by the faults alone.
            ping_interval=10,
            max_outstanding_pings=3,
            reconnect_time_wait=0.1,
            max_reconnect_attempts=-1,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
            error_cb=quiet,
        )
        return self.nc


@pytest.fixture
async def proxy(nats_server: NatsServer) -> AsyncIterator[FaultProxy]:
    p = await FaultProxy([("127.0.0.1", nats_server.client_port)], seed=1).start()
    yield p
    await p.stop()


@pytest.fixture
async def echo(nats_server: NatsServer) -> AsyncIterator[Client]:
    """A responder on the server directly, off the proxy."""
    nc = await nats.connect(nats_server.url)

    async def answer(msg: Msg) -> None:
        await msg.respond(msg.data)

    await nc.subscribe("echo", cb=answer)
    await settled(nc)
    yield nc
    await nc.close()


@pytest.fixture
async def watched(proxy: FaultProxy, echo: Client) -> AsyncIterator[Watched]:
    del echo  # only needs to be answering
    w = Watched()
    await w.connect(proxy.url)
    yield w
    await w.nc.close()


def connections(server: NatsServer) -> int:
    url = f"http://127.0.0.1:{server.monitor_port}/connz"
    with urllib.request.urlopen(url, timeout=2) as resp:
        return int(json.load(resp)["num_connections"])


async def test_a_request_and_its_reply_pass_through_the_proxy(
    proxy: FaultProxy, watched: Watched
) -> None:
    reply = await watched.nc.request("echo", b"hello", timeout=2)
    assert reply.data == b"hello"
    assert proxy.stats.accepted == 1
    assert proxy.stats.forwarded[Direction.UP] > 0
    assert proxy.stats.forwarded[Direction.DOWN] > 0


async def test_a_round_trip_takes_at_least_twice_the_one_way_latency(
    proxy: FaultProxy, watched: Watched
) -> None:
    await proxy.set(latency_ms=150, jitter_ms=30)
    loop = asyncio.get_running_loop()
    for _ in range(3):
        start = loop.time()
        reply = await watched.nc.request("echo", b"slow", timeout=5)
        assert reply.data == b"slow"
        assert loop.time() - start >= 0.3
    await proxy.set()  # a clean link again, on the same connection
    assert (await watched.nc.request("echo", b"fast", timeout=2)).data == b"fast"
    assert watched.disconnects == 0


async def test_a_narrow_link_takes_its_time_both_ways(proxy: FaultProxy, watched: Watched) -> None:
    await proxy.set(bandwidth=100_000)
    loop = asyncio.get_running_loop()
    start = loop.time()
    reply = await watched.nc.request("echo", bytes(50_000), timeout=10)
    assert len(reply.data) == 50_000
    assert loop.time() - start >= 0.95  # 50 kB up and 50 kB down at 100 kB/s, less a segment


async def test_jitter_never_reorders_a_stream(proxy: FaultProxy, watched: Watched) -> None:
    nc = watched.nc
    sub = await nc.subscribe("seq")
    await settled(nc)
    await proxy.set(latency_ms=5, jitter_ms=40)
    for i in range(200):
        await nc.publish("seq", str(i).encode())
        if i % 20 == 0:
            await settled(nc)  # many separate writes, each drawn its own delay
    got = [int((await sub.next_msg(timeout=5)).data) for _ in range(200)]
    assert got == list(range(200))


@pytest.mark.parametrize("drop", [False, True])
async def test_a_blackhole_silences_the_link_without_closing_it_and_heals(
    proxy: FaultProxy, watched: Watched, drop: bool
) -> None:
    nc = watched.nc
    before = nc.client_id
    # Subscribed to its reply inbox before the fault: a dropping blackhole would lose the
    # SUB itself, and with it every later reply (the reason holding is the default).
    assert (await nc.request("echo", b"first", timeout=2)).data == b"first"
    await proxy.blackhole(drop=drop)
    for _ in range(3):  # about a second of silence
        with pytest.raises(NatsTimeout):
            await nc.request("echo", b"lost?", timeout=0.3)
    assert nc.is_connected
    assert watched.disconnects == 0
    assert proxy.connections == 1
    assert (proxy.stats.dropped[Direction.UP] > 0) is drop
    await proxy.heal()
    reply = await nc.request("echo", b"back", timeout=2)
    assert reply.data == b"back"
    assert nc.client_id == before  # the same connection, never dropped
    assert watched.disconnects == 0
    assert proxy.stats.accepted == 1


async def test_a_reset_disconnects_the_client_which_reconnects_through_the_proxy(
    proxy: FaultProxy, watched: Watched
) -> None:
    nc = watched.nc
    before = nc.client_id
    assert await proxy.reset() == 1
    await asyncio.wait_for(watched.reconnected.wait(), 10)
    assert watched.disconnects >= 1
    assert nc.client_id != before
    assert (await nc.request("echo", b"again", timeout=2)).data == b"again"
    assert proxy.stats.accepted == 2  # the new connection came through the proxy too
    assert nc.connected_url is not None
    assert nc.connected_url.port == proxy.port


async def test_a_reset_is_an_rst_not_a_close(proxy: FaultProxy) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    assert (await reader.readline()).startswith(b"INFO ")
    await proxy.reset()
    with pytest.raises(ConnectionResetError):
        await reader.read(1024)  # a FIN would read b"" instead
    writer.close()


async def test_a_slow_close_reaches_the_server_late(
    nats_server: NatsServer, proxy: FaultProxy, echo: Client
) -> None:
    del echo  # its connection is the one the server keeps
    await proxy.slow_close(2000)
    w = Watched()
    await w.connect(proxy.url)
    assert await asyncio.to_thread(connections, nats_server) == 2
    loop = asyncio.get_running_loop()
    closed = loop.time()
    await w.nc.close()
    while await asyncio.to_thread(connections, nats_server) == 2:
        await asyncio.sleep(0.05)  # polling the server's view, not waiting out a guess
        assert loop.time() - closed < 10, "the server never saw the close"
    assert loop.time() - closed >= 2.0


def test_a_proxy_in_its_own_thread_is_driven_from_another_loop(
    nats_server: NatsServer,
) -> None:
    host = ProxyThread()
    try:
        proxy = host.start_proxy([("127.0.0.1", nats_server.client_port)])

        async def through() -> bytes:
            nc = await nats.connect(proxy.url)
            sub = await nc.subscribe("loop")
            await proxy.set(latency_ms=20, direction=Direction.DOWN)
            await nc.publish("loop", b"round")
            msg = await sub.next_msg(timeout=2)
            await nc.close()
            return msg.data

        assert asyncio.run(through()) == b"round"
        assert proxy.toxics[Direction.DOWN].latency_s == pytest.approx(0.02)
        assert proxy.toxics[Direction.UP].latency_s == 0.0
    finally:
        host.stop()


# -- in the chaos harness ------------------------------------------------------------------


def test_a_proxied_process_of_the_swarm_connects_through_its_own_proxy(tmp_path: Path) -> None:
    swarm = Swarm(tmp_path, tmp_path / "topology.json", proxied={"telemetry"})
    try:
        swarm.start_servers()
        swarm.start("telemetry", "telemetry", "--id", "telemetry")
        swarm.start("breaker", "breaker", "--id", "breaker")
        proxy = swarm.proxy("telemetry")
        assert swarm.supervisor.specs["telemetry"].argv[-1] == proxy.url
        assert swarm.supervisor.specs["breaker"].argv[-1] == swarm.url
        assert list(swarm.proxies) == ["telemetry"]
        deadline = time.monotonic() + 20
        while proxy.connections < 1:
            assert time.monotonic() < deadline, swarm.supervisor.log("telemetry")
            time.sleep(0.05)
    finally:
        swarm.stop_all()


def test_in_a_cluster_a_proxied_client_stays_on_its_proxy_when_its_server_dies(
    tmp_path: Path,
) -> None:
    swarm = Swarm(tmp_path, tmp_path / "topology.json", cluster=3, proxied={"node-*"})
    try:
        swarm.start_servers()
        assert swarm.nats_for("router-1") == swarm._url_for("router-1")
        url = swarm.nats_for("node-x")  # what the process "node-x" would be given
        proxy = swarm.proxy("node-x")
        first = next(
            i for i, s in enumerate(swarm.servers) if s.client_port == proxy.upstreams[0][1]
        )

        async def through() -> None:
            w = Watched()
            nc = await w.connect(url)
            assert nc.discovered_servers == []  # the servers keep their peers to themselves
            await asyncio.to_thread(swarm.kill_server, first)
            await asyncio.wait_for(w.reconnected.wait(), 10)
            assert nc.connected_url is not None
            assert nc.connected_url.port == proxy.port
            sub = await nc.subscribe("after")
            await nc.publish("after", b"on another server")
            assert (await sub.next_msg(timeout=2)).data == b"on another server"
            await nc.close()

        asyncio.run(through())
        assert proxy.stats.accepted == 2
    finally:
        swarm.stop_all()
