"""A subscription is the server's before we say it is: on a real server whose trace
shows the order it read each connection's commands in, a service's ``ready`` (and
:func:`settled`) returns only after the server has read the SUBs made before it, where
nats-py's ``flush`` writes its PING ahead of them (the first request across a tenant's
import was then, now and again, answered "no responders")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import msgspec
import nats
import pytest

from hecate.bus.server import NatsServer
from hecate.bus.service import Service
from hecate.bus.settle import settled


class Ask(msgspec.Struct):
    text: str = ""


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "nats", jetstream=False, extra_args=("-DV",)).start()
    yield server
    server.stop()


def read_before_ping(server: NatsServer, name: str) -> list[str]:
    """The SUBs the server read on the connection named ``name`` before that
    connection's last PING (the server logs a command as it reads it, before it acts on
    it: a PING is in the log before its PONG is sent)."""
    lines = [ln for ln in server.log_file.read_text().splitlines() if f':{name}"' in ln]
    last_ping = max(i for i, ln in enumerate(lines) if "<<- [PING]" in ln)
    return [m.group(1) for ln in lines[:last_ping] if (m := re.search(r"<<- \[(SUB \S+)", ln))]


async def test_settled_returns_once_the_server_read_the_subscriptions(
    traced: NatsServer,
) -> None:
    nc = await nats.connect(traced.url, name="settling")
    try:
        for n in range(3):
            await nc.subscribe(f"settle.{n}")
        await settled(nc)
        assert read_before_ping(traced, "settling") == [f"SUB settle.{n}" for n in range(3)]
    finally:
        await nc.close()


async def test_a_service_is_ready_once_the_server_holds_its_endpoints(
    traced: NatsServer,
) -> None:
    async def answer(ask: Ask, headers: Mapping[str, str]) -> Ask:
        del headers
        return ask

    svc = Service(
        kind="test",
        name="settle",
        instance_id="s1",
        description="a test service",
        log=logging.getLogger("test.settle"),
    )
    await svc.start(traced.url)
    try:
        await svc.add_endpoint("echo", "test.echo", Ask, answer)
        await svc.ready()
        assert "SUB test.echo" in read_before_ping(traced, "settle-s1-in")
    finally:
        await svc.stop(grace=1.0)


async def test_a_caller_that_gives_up_on_settling_leaves_the_connection_whole(
    traced: NatsServer,
) -> None:
    """A task stopped while it settles (a heartbeat loop cancelled at its flush) must not
    cost the connection: nats-py's own ``flush`` left its cancelled future for the PONG,
    whose arrival raised InvalidStateError in the read loop and reconnected the client."""
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(traced.url, name="giving-up", error_cb=on_error)
    try:
        for _ in range(5):
            waiting = asyncio.create_task(settled(nc))
            while not nc._pongs:  # until its PING is out and its PONG awaited
                await asyncio.sleep(0)
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
        await settled(nc)  # every PONG since has been read
        assert errors == []
        assert nc.stats["reconnects"] == 0
        assert nc.is_connected
    finally:
        await nc.close()
