"""``hecate bench breaker``: how fast an OPEN reaches every router, and how fast an
open circuit rejects.

On one embedded nats-server: the breaker service (its own process) and ``watchers``
KV watchers on separate connections, each the path a router replica uses
(``BreakerView.follow``). For each of ``trips`` targets the bench publishes the five
failure reports that trip a circuit and measures, per watcher, the time from the last
report to seeing the target open: report → breaker service → compare-and-set write →
KV watch delivery. Rejection times are in-process: the core breaker's ``allow()`` on an
open circuit, and a router's per-node check.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import platform
import tempfile
import time
import timeit
from pathlib import Path

import msgspec
import nats

from hecate.bus import kv as kvs
from hecate.bus.server import NatsServer
from hecate.resilience.breaker import BreakerSnapshot, CircuitBreaker
from hecate.wire import subjects
from hecate.wire.messages import OutcomeReport
from hecate_dev.bench.results import BreakerMeta, BreakerResult, Spread
from hecate_launcher import Supervisor


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 3)


async def _serving(nc: nats.NATS, within_s: float = 30.0) -> None:
    """Until the breaker service lists its report endpoint in $SRV.INFO (it is then
    subscribed): reports sent earlier would be lost."""
    subject = f"$SRV.INFO.{subjects.SERVICE_NAMES['breaker']}"
    deadline = time.monotonic() + within_s
    while True:
        try:
            info = json.loads((await nc.request(subject, b"", timeout=0.5)).data)
            if any(e.get("name") == "report" for e in info.get("endpoints", [])):
                return
        except Exception:  # not up yet
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the breaker service never listed its report endpoint")
        await asyncio.sleep(0.05)


async def _propagation(url: str, watchers: int, trips: int) -> list[float]:
    seen: dict[tuple[int, str], float] = {}
    connections = [await nats.connect(url) for _ in range(watchers)]
    await _serving(connections[0])
    tasks = []

    async def watch(w: int, nc: nats.NATS) -> None:
        kv = await kvs.bucket(nc, subjects.BREAKER_BUCKET)
        watcher = await kv.watchall()
        async for entry in watcher:
            if entry is None or not entry.value or entry.key is None:
                continue
            if msgspec.json.decode(entry.value, type=BreakerSnapshot).state == "open":
                seen.setdefault((w, entry.key), time.perf_counter())

    for w, nc in enumerate(connections):
        tasks.append(asyncio.create_task(watch(w, nc)))
    pub = await nats.connect(url)
    await asyncio.sleep(0.3)
    delays: list[float] = []
    for i in range(trips):
        target = f"bench-target-{i}"
        for _ in range(5):
            report = OutcomeReport(target=target, ok=False, code="rate_limited")
            await pub.publish(subjects.breaker_report(target), msgspec.json.encode(report))
        await pub.flush()
        sent = time.perf_counter()
        deadline = sent + 2.0
        while time.perf_counter() < deadline and not all(
            (w, target) in seen for w in range(watchers)
        ):
            await asyncio.sleep(0.0005)
        delays += [
            (seen[(w, target)] - sent) * 1000 for w in range(watchers) if (w, target) in seen
        ]
        await asyncio.sleep(0.01)
    for t in tasks:
        t.cancel()
    for nc in [*connections, pub]:
        await nc.close()
    return delays


def run_breaker_bench(*, watchers: int = 3, trips: int = 50) -> BreakerResult:
    env = dict(os.environ, HECATE_LOG_LEVEL="WARNING")
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp) / "nats").start()
        swarm = Supervisor(env=env)
        swarm.run("breaker", "breaker", "--nats", server.url, "--id", "bench")
        try:
            delays = asyncio.run(_propagation(server.url, watchers, trips))
        finally:
            swarm.stop()
            server.stop()
    now = [0.0]
    breaker = CircuitBreaker(clock=lambda: now[0])
    for _ in range(5):
        breaker.record_failure()
    assert breaker.state == "open"
    n = 200_000
    reject_us = timeit.timeit(breaker.allow, number=n) / n * 1e6
    return BreakerResult(
        open_seen_ms=Spread(
            p50=_pct(delays, 0.5) if delays else None,
            p99=_pct(delays, 0.99) if delays else None,
            max=round(max(delays), 3) if delays else None,
            samples=len(delays),
            expected=watchers * trips,
        ),
        open_reject_us=round(reject_us, 3),
        meta=BreakerMeta(
            watchers=watchers,
            trips=trips,
            python=platform.python_version(),
            machine=f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
            date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        ),
    )
