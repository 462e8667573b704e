"""hecate up's watch over its services, on real processes and a real nats-server: a
process that exits is started again after its pause, told how often it was (the
variable its $SRV answers read), each exit and start said, each start published as a
ServiceRestarted event; a process that keeps running is left alone."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

import msgspec
from nats.aio.client import Client

from hecate.bus.discovery import RESTARTS_ENV
from hecate.wire import subjects
from hecate.wire.messages import ServiceRestarted
from hecate_launcher import ProcessSpec, Supervisor
from hecate_launcher.keeper import Keeper
from hecate_launcher.keeping import keep
from tests.support.waits import until


def python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


async def test_an_exited_service_starts_again_said_and_published(
    client: Client, tmp_path: Path
) -> None:
    heard: list[ServiceRestarted] = []

    async def on_event(msg: object) -> None:
        heard.append(msgspec.json.decode(msg.data, type=ServiceRestarted))  # type: ignore[attr-defined]

    await client.subscribe(subjects.EVENT_RESTARTED, cb=on_event)
    runs = tmp_path / "runs"
    # Each run notes the restart count it was given, then exits at once (1).
    flaky = (
        f"import os, sys; given = os.environ.get({RESTARTS_ENV!r}, '0'); "
        f"open({str(runs)!r}, 'a').write(given + '\\n'); sys.exit(1)"
    )
    lines: list[str] = []
    with Supervisor(logs=tmp_path) as supervisor:
        supervisor.start(ProcessSpec("flaky", (), program=python(flaky)))
        supervisor.start(ProcessSpec("steady", (), program=python("import time; time.sleep(60)")))

        async def tell(ev: ServiceRestarted) -> None:
            await client.publish(subjects.EVENT_RESTARTED, msgspec.json.encode(ev))

        keeper = Keeper(first_s=0.2, most_s=0.4)
        task = asyncio.create_task(
            keep(
                supervisor,
                ["flaky", "steady"],
                tell=tell,
                say=lines.append,
                keeper=keeper,
                poll_s=0.05,
            )
        )
        try:
            await until(lambda: len(heard) >= 3, "three restarts published", timeout=20)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        steady = supervisor.procs["steady"]
        assert steady.poll() is None  # never touched
    assert [e.label for e in heard[:3]] == ["flaky"] * 3
    assert [e.restarts for e in heard[:3]] == [1, 2, 3]
    assert [e.delay_s for e in heard[:3]] == [0.2, 0.4, 0.4]
    assert all(e.exit_code == 1 for e in heard)
    assert runs.read_text().split()[:3] == ["0", "1", "2"]
    assert "flaky exited (1); starting it again in 0.2 s (restart 1)" in lines
    assert any(line.startswith("flaky started again, pid ") for line in lines)
    assert not any("steady" in line for line in lines)
