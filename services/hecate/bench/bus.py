"""``hecate bench bus``: routed requests against raw NATS request/reply, same run.

Everything runs as separate processes on one embedded nats-server: an echo responder
(the raw baseline), one router and the nodes of a 1-stage or a 3-stage pipeline (the
plan is written to KV directly, as any valid plan writer may). The load comes from this
process: ``inflight`` concurrent requesters for ``seconds`` each. Reported: requests per
second and p50/p99 latency, and routed throughput as a ratio of raw. Nodes run the
``null`` executor by default (no arithmetic), so the ratio prices the bus path alone;
``--executor toy`` adds the built-in model's compute. Every process uses uvloop when
it is installed, the raw echo included.

Then, for raw, routed 1-stage and routed 3-stage chained (``sweep``), an open-loop
sweep: a fixed rate offered for a few seconds, at fractions of that configuration's
closed-loop throughput up to overload (10 % to 120 %), with latency counted from each
request's scheduled send time (:mod:`hecate.bench.openloop`). Reported per rate: the
throughput achieved, p50/p99 latency, failed and timed-out requests.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import nats

from hecate.bench.openloop import ladder, offer
from hecate.bus import kv as kvs
from hecate.bus.credentials import Credentials
from hecate.bus.secure import SecureBus, prepare
from hecate.bus.server import NatsServer
from hecate.cli.up import hecate_command, stop_processes
from hecate.core import ModelSpec, NodeProfile, Pipeline, Stage, SwarmPlan
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest

ANONYMOUS = Credentials()

ECHO = """
import asyncio, sys, nats
try:
    import uvloop
    uvloop.install()
except ImportError:
    pass
async def main():
    nc = await nats.connect(sys.argv[1])
    async def echo(msg):
        await msg.respond(msg.data)
    await nc.subscribe("bench.echo", cb=echo)
    await nc.flush()
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def _drive(
    url: str,
    subject: str,
    body: bytes,
    inflight: int,
    seconds: float,
    check: bool,
    creds: Credentials = ANONYMOUS,
) -> dict[str, float]:
    nc = await nats.connect(url, **creds.options())
    latencies: list[float] = []
    failures = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal failures
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            try:
                msg = await nc.request(subject, body, timeout=5)
            except Exception:
                failures += 1
                continue
            latencies.append(time.perf_counter() - t0)
            if check and not msgspec.json.decode(msg.data, type=InferReply).ok:
                failures += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    elapsed = time.perf_counter() - started
    await nc.close()
    latencies.sort()
    n = len(latencies)
    return {
        "rps": round(n / elapsed, 1),
        "p50_us": round(latencies[n // 2] * 1e6, 1) if n else 0.0,
        "p99_us": round(latencies[min(n - 1, int(n * 0.99))] * 1e6, 1) if n else 0.0,
        "requests": n,
        "failures": failures,
    }


async def _wait_ready(
    url: str, subject: str, body: bytes, routed: bool, creds: Credentials = ANONYMOUS
) -> None:
    nc = await nats.connect(url, **creds.options())
    try:
        for _ in range(300):
            try:
                msg = await nc.request(subject, body, timeout=1)
                if not routed or msgspec.json.decode(msg.data, type=InferReply).ok:
                    return
            except Exception:
                pass
            await asyncio.sleep(0.05)
        raise RuntimeError(f"{subject} never answered")
    finally:
        await nc.close()


async def _write_plan(url: str, stages: int, layers: int, creds: Credentials = ANONYMOUS) -> None:
    per = layers // stages
    nodes = tuple(NodeProfile(node_id=f"bench-{i}", capacity_layers=per) for i in range(stages))
    plan = SwarmPlan(
        epoch=0,
        models=(ModelSpec(model_id="bench", layers=layers),),
        nodes=nodes,
        pipelines=(
            Pipeline(
                pipeline_id="bench-r0",
                model_id="bench",
                stages=tuple(
                    Stage(node_id=n.node_id, layer_start=i * per, layer_end=(i + 1) * per)
                    for i, n in enumerate(nodes)
                ),
            ),
        ),
    )
    nc = await nats.connect(url, **creds.options())
    kv = await kvs.bucket(nc, subjects.PLAN_BUCKET)
    await kv.put(subjects.PLAN_KEY, msgspec.json.encode(plan))
    await nc.close()


CONFIGURATIONS = {  # label: (stages, dispatch); 0 stages is the raw echo
    "raw": (0, ""),
    "routed_1": (1, "hop"),
    "routed_3": (3, "hop"),
    "routed_3_chain": (3, "chain"),
    "routed_1_secure": (1, "hop"),
}
# On a locked-down bus: TLS, and each process logs in as its role (``hecate up --secure``).
SECURE = frozenset({"routed_1_secure"})
SWEPT = ("raw", "routed_1", "routed_3_chain")
SWEEP_FRACTIONS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.2, 1.5)
QUICK_SWEEP_FRACTIONS = (0.25, 0.7, 1.2)


def _start(
    label: str,
    url: str,
    layers: int,
    executor: str,
    env: dict[str, str],
    bus: SecureBus | None = None,
) -> tuple[list[subprocess.Popen[bytes]], str, bytes, bool]:
    """The processes of one configuration; returns them, the subject to load, the
    request body and whether replies are routed ``InferReply``s."""
    stages, mode = CONFIGURATIONS[label]
    quiet = subprocess.DEVNULL
    if stages == 0:
        echo = subprocess.Popen(
            [sys.executable, "-c", ECHO, url], env=env, stdout=quiet, stderr=quiet
        )
        return [echo], "bench.echo", b"x" * 256, False
    asyncio.run(_write_plan(url, stages, layers, bus.credentials("planner") if bus else ANONYMOUS))
    argv = [
        [*hecate_command(), "router", "--nats", url, "--id", "bench-router", "--dispatch", mode]
    ]
    argv += [
        [
            *hecate_command(),
            "node",
            "--nats",
            url,
            "--id",
            f"bench-{i}",
            "--capacity-layers",
            str(layers // stages),
            "--executor",
            executor,
        ]
        for i in range(stages)
    ]
    procs = [
        subprocess.Popen(
            a,
            env={**env, **(bus.credentials(a[len(hecate_command())]).to_env() if bus else {})},
            stdout=quiet,
            stderr=quiet,
        )
        for a in argv
    ]
    body = msgspec.json.encode(InferRequest(prompt="bench", max_tokens=1))
    return procs, subjects.infer("bench"), body, True


@dataclass
class _Setup:
    """One configuration standing: its server, its processes, what to send and as whom."""

    label: str
    server: NatsServer
    procs: list[subprocess.Popen[bytes]]
    subject: str
    body: bytes
    routed: bool
    creds: Credentials

    @property
    def url(self) -> str:
        return self.server.url

    @classmethod
    def start(
        cls, label: str, tmp: Path, layers: int, executor: str, env: dict[str, str]
    ) -> _Setup:
        bus = prepare(tmp / label / "secure") if label in SECURE else None
        server = NatsServer(
            tmp / label,
            extra_config=bus.server_config() if bus else "",
            env=bus.server_env() if bus else None,
        ).start()
        try:
            procs, subject, body, routed = _start(label, server.url, layers, executor, env, bus)
        except BaseException:
            server.stop()
            raise
        creds = bus.credentials("tenant-a") if bus else ANONYMOUS
        return cls(label, server, procs, subject, body, routed, creds)

    async def drive(self, inflight: int, seconds: float) -> dict[str, float]:
        return await _drive(
            self.url, self.subject, self.body, inflight, seconds, self.routed, self.creds
        )

    def stop(self) -> None:
        stop_processes(self.procs)
        self.server.stop()


def _routed_ok(data: bytes) -> bool:
    try:
        return msgspec.json.decode(data, type=InferReply).ok
    except msgspec.DecodeError:
        return False


def run_bus_bench(
    *,
    seconds: float = 3.0,
    inflight: int = 64,
    layers: int = 3,
    executor: str = "null",
    configurations: tuple[str, ...] = tuple(CONFIGURATIONS),
    sweep: tuple[float, ...] = SWEEP_FRACTIONS,
    sweep_seconds: float = 3.0,
    timeout_s: float = 2.0,
    rounds: int = 3,
) -> dict[str, Any]:
    """Closed loop (``inflight`` requesters, ``seconds`` per configuration per round, the
    configurations interleaved for ``rounds`` rounds; each figure is the median round and
    each ratio the median of the rounds' ratios), then, for the
    ``SWEPT`` ones, an open-loop sweep offering each fraction of ``sweep`` of that
    configuration's closed-loop throughput for ``sweep_seconds``."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", HECATE_LOG_LEVEL="WARNING")
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)  # measure without exporting
    out: dict[str, Any] = {}
    swept: dict[str, list[dict[str, Any]]] = {}
    setups: list[_Setup] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            # Every configuration stands at once (idle ones cost next to nothing), so the
            # closed loop can interleave them round by round: a ratio compares figures
            # taken minutes, not seconds, apart only if the machine's speed held still.
            for label in configurations:
                setups.append(_Setup.start(label, Path(tmp), layers, executor, env))
            for st in setups:
                asyncio.run(_wait_ready(st.url, st.subject, st.body, st.routed, st.creds))
                asyncio.run(st.drive(inflight, 0.5))  # warm up
            runs: dict[str, list[dict[str, float]]] = {st.label: [] for st in setups}
            for _ in range(rounds):
                for st in setups:
                    runs[st.label].append(asyncio.run(st.drive(inflight, seconds)))
            for label, figures in runs.items():
                by_rps = sorted(figures, key=lambda f: f["rps"])
                out[label] = {**by_rps[len(by_rps) // 2], "rounds_rps": [f["rps"] for f in figures]}
            for st in setups:
                if st.label in SWEPT and sweep:
                    swept[st.label] = []
                    for rate in ladder(out[st.label]["rps"], sweep):
                        point = offer(
                            st.url,
                            st.subject,
                            st.body,
                            rate=rate,
                            seconds=sweep_seconds,
                            timeout_s=timeout_s,
                            judge=_routed_ok if st.routed else None,
                        )
                        swept[st.label].append(asyncio.run(point))
                        time.sleep(0.2)  # let any backlog drain before the next rate
        finally:
            for st in setups:
                st.stop()
    for label, ratio in (
        ("routed_1", "ratio_1"),
        ("routed_3", "ratio_3"),
        ("routed_3_chain", "ratio_3_chain"),
        ("routed_1_secure", "ratio_1_secure"),
    ):
        if "raw" in runs and label in runs:
            per_round = [
                round(a["rps"] / b["rps"], 3) if b["rps"] else 0.0
                for a, b in zip(runs[label], runs["raw"], strict=True)
            ]
            out[ratio] = statistics.median(per_round)
            out[f"{ratio}_rounds"] = per_round
    if "routed_1" in runs and "routed_1_secure" in runs:
        out["secure_over_open"] = statistics.median(
            round(a["rps"] / b["rps"], 3) if b["rps"] else 0.0
            for a, b in zip(runs["routed_1_secure"], runs["routed_1"], strict=True)
        )
    if swept:
        out["sweep"] = swept
    out["meta"] = {
        "inflight": inflight,
        "seconds": seconds,
        "rounds": rounds,
        "layers": layers,
        "executor": executor,
        "sweep_fractions": list(sweep),
        "sweep_seconds": sweep_seconds,
        "sweep_timeout_s": timeout_s,
        "dispatch": "routed_*: the router calls each stage in turn (hop); routed_3_chain: "
        "nodes forward to each other; both correlate replies, no task per request",
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
    }
    return out
