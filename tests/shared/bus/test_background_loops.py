"""A service's background loops on a real nats-server: one that raises ends the service
(logged with its name; as a process, exit 1, so its supervisor restarts it), and stop
cancels them without calling that a failure."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from hecate.bus.server import NatsServer
from hecate.bus.service import LoopFailed, Service

# A service that runs through the one entry point every ``hecate <service>`` command
# uses (run_service), and whose one loop raises a moment after it is up.
FAILS = """
import asyncio, sys
from hecate.bus.service import Service
from hecate.cli.process import run_service

class Doomed:
    def __init__(self, log):
        self.service = Service(
            kind="doomed", name="doomed", instance_id="d1", description="fails", log=log
        )

    async def run(self, url, stop):
        await self.service.start(url)
        self.service.spawn(self.watch())
        await stop.wait()
        await self.service.stop()

    async def watch(self):
        await asyncio.sleep(0.2)
        raise ValueError("the watch broke")

sys.exit(run_service("doomed", "d1", sys.argv[1], lambda log, tp: Doomed(log)))
"""


def _service(log: logging.Logger) -> Service:
    return Service(kind="loops", name="loops", instance_id="l1", description="loops", log=log)


def _records(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, object]]:
    return [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == name]


def test_a_process_whose_loop_raises_exits_nonzero_and_says_which(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", FAILS, nats_server.url],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
            cwd=tmp_path,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            "the service was still running 20 s after its only loop raised"
        ) from exc
    assert done.returncode == 1, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    (failed,) = [d for d in lines if d["event"] == "background loop failed"]
    assert failed["level"] == "error"
    assert failed["loop"] == "Doomed.watch"
    assert failed["error"] == "ValueError('the watch broke')"
    assert "the watch broke" in failed["exception"]  # the traceback, for whoever reads it
    assert any(d["event"] == "service crashed" for d in lines)


async def test_a_loop_that_raises_ends_the_task_that_started_the_service(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="test.loops")
    svc = _service(logging.getLogger("test.loops"))
    beats = 0

    async def beating() -> None:  # a sibling that would go on forever on its own
        nonlocal beats
        while True:
            beats += 1
            await asyncio.sleep(0.01)

    async def broken() -> None:
        await asyncio.sleep(0.1)
        raise KeyError("plan")

    async def run() -> None:
        await svc.start(nats_server.url)
        svc.spawn(beating())
        svc.spawn(broken())
        await asyncio.Event().wait()  # as a service waits for its stop

    task = asyncio.create_task(run())
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    assert isinstance(svc.failure, LoopFailed)
    assert (svc.failure.loop, repr(svc.failure.error)) == (
        "test_a_loop_that_raises_ends_the_task_that_started_the_service.<locals>.broken",
        "KeyError('plan')",
    )
    (failed,) = _records(caplog, "background loop failed")
    assert failed["error"] == "KeyError('plan')"
    assert str(failed["loop"]).endswith("broken")
    # The sibling was cancelled with it, and the connections are closed: nothing of
    # the failed service goes on in the background.
    seen = beats
    await asyncio.sleep(0.05)
    assert beats == seen
    assert svc.inbound is not None
    assert svc.inbound.is_closed
    assert svc.outbound is not None
    assert svc.outbound.is_closed
    # A loop spawned now never runs.
    late = svc.spawn(broken())
    await asyncio.sleep(0)
    assert late.cancelled()


async def test_stop_cancels_the_loops_and_that_is_not_a_failure(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="test.loops")
    svc = _service(logging.getLogger("test.loops"))
    cancelled: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    async def raises_when_cancelled() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            raise RuntimeError("cleanup went wrong")  # on its way out: not the cause

    await svc.start(nats_server.url)
    loops = [svc.spawn(forever("a")), svc.spawn(forever("b")), svc.spawn(raises_when_cancelled())]
    await asyncio.sleep(0.05)
    await asyncio.wait_for(svc.stop(grace=2.0), 10)
    assert sorted(cancelled) == ["a", "b"]
    assert all(t.done() for t in loops)
    assert svc.failure is None
    assert _records(caplog, "background loop failed") == []
    (late,) = _records(caplog, "background loop error while stopping")
    assert late["error"] == "RuntimeError('cleanup went wrong')"
    assert svc.outbound is not None
    assert svc.outbound.is_closed
    after = svc.spawn(forever("c"))  # after stop: never runs
    await asyncio.sleep(0)
    assert after.cancelled()
    assert "c" not in cancelled
