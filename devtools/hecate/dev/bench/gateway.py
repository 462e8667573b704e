"""``hecate bench gateway``: what the HTTP gateway adds over asking the swarm on NATS.

The swarm is ``hecate up``'s for the topology, process for process
(:func:`hecate.launch.plan_commands`), on an embedded nats-server, with ``hecate gateway
--open --port 0`` beside it as its own process, as in production. Nothing is tuned for
the benchmark. Two parts:

* **The toy model** (``examples/swarm.json``, ``make run-toy``'s swarm): the same
  ``/v1/completions`` asked directly on NATS (``hecate.infer.<model>``, the request the
  gateway itself would send) and through the gateway.

  - *Latency added*: one request at a time, the paths taking turns request by request
    (their order rotated), so a slow second of the machine falls on all of them. Over
    HTTP twice, each on one keep-alive connection: with
    :class:`hecate.dev.bench.gateway_load.Http1`, the least an HTTP client can do (the
    figure the targets judge: what the gateway adds, not what a client library costs),
    and with httpx, which the ``openai`` SDK is built on (what such a client sees;
    the gap between the two is httpx's own time, on the very same requests and
    answers). Added p50 and p99 are the differences of the paths' p50 and p99.
  - *Capacity*: ``processes`` worker processes keep N clients busy in a closed loop
    (:mod:`hecate.dev.bench.gateway_load`), N at each of ``clients``, on NATS directly and
    through the gateway in turn, for ``rounds`` rounds; each path's capacity is its
    best level's median round (``growing``: the most clients still gave over 10 %
    more than the level below, so it is only a floor), the ratio the median of the
    rounds' ratios of best levels. Every process's CPU over each window is read from
    ``/proc``, the workers' included: the report says where the time went and what
    the load cost.

* **SmolLM2 streaming** (only if ``smollm2-135m`` is pulled; never pulled here): ``make
  run``'s swarm (:mod:`hecate.dev.bench.gateway_stream`).

Every answer is checked against the direct answer for the same prompt; a wrong one is
listed in ``failed_checks`` (and fails the command after the result is saved).
Verdicts are :func:`hecate.dev.bench.report.gateway.judge`'s, from the figures alone, the
same the report gives.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats

from hecate.bus.server import NatsServer
from hecate.core import HecateError
from hecate.dev.bench.gateway_load import (
    TIMEOUT_S,
    Ask,
    Http1,
    Workers,
    ask_direct,
    completion_body,
    text_of_completion,
)
from hecate.dev.bench.generators import run_on_uvloop
from hecate.dev.bench.openloop import percentile
from hecate.dev.bench.report.gateway import TARGETS_US, judge, said, wrong_answers
from hecate.launch import ProcessSpec, Supervisor, plan_commands

TOY_MODEL = "ncm-base"
TOY_TOPOLOGY = "examples/swarm.json"
TOY_TOKENS = 8
PROMPTS = 8  # distinct prompts, taken in turn
PATHS = ("direct", "gateway", "gateway_httpx")
# --quick: a smoke run, seconds not minutes; its figures are too few to judge by.
QUICK: dict[str, Any] = {
    "samples": 300,
    "warmup": 30,
    "clients": (64,),
    "seconds": 1.0,
    "rounds": 1,
    "stream_tokens": 16,
    "stream_rounds": 1,
}


def toy_topology() -> Path:
    """``examples/swarm.json`` of the source tree this runs from (``make bench`` runs in
    it), else of the working directory."""
    for root in (Path(__file__).resolve().parents[4], Path.cwd()):
        if (root / TOY_TOPOLOGY).is_file():
            return root / TOY_TOPOLOGY
    raise HecateError(f"bench gateway: no {TOY_TOPOLOGY} here (run it from the repository)")


# -- the swarm and its gateway ----------------------------------------------------------
@dataclass
class Standing:
    """A swarm standing with its gateway: where to reach them, and every process."""

    url: str  # NATS
    base: str  # the gateway, http://127.0.0.1:PORT
    pids: dict[str, int] = field(default_factory=dict)  # label -> pid


def bench_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, HECATE_LOG_LEVEL="WARNING", **extra)
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)  # measure without exporting
    return env


def _listening(log: Path, proc: subprocess.Popen[bytes], wait_s: float) -> int:
    """The port the gateway says it listens on (its ``listening`` log line)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if '"listening"' in line:
                return int(json.loads(line)["port"])
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited ({proc.returncode}); see {log}")
        time.sleep(0.05)
    raise RuntimeError(f"the gateway never said where it listens; see {log}")


@contextlib.contextmanager
def standing(workdir: Path, topology: Path, env: dict[str, str]) -> Iterator[Standing]:
    """``hecate up --topology TOPOLOGY``'s processes and a gateway (``--open``, any free
    port), logs in ``workdir``; everything stopped (SIGTERM, then SIGKILL) on the way out."""
    server = NatsServer(workdir / "nats", max_payload=1024 * 1024).start()
    swarm = Supervisor(env=env, logs=workdir)
    try:
        shape = argparse.Namespace(
            topology=str(topology), strategy="greedy", pipelines=2, routers=2
        )
        for spec in plan_commands(shape, server.url):
            swarm.start(spec)
        # The gateway at its own default level: its "listening" line says the port.
        gateway = ("gateway", "--nats", server.url, "--open", "--port", "0", "--id", "bench")
        swarm.start(ProcessSpec("gateway", gateway, {"HECATE_LOG_LEVEL": "INFO"}))
        port = _listening(swarm.log_path("gateway"), swarm.procs["gateway"], 60.0)
        assert server.process is not None
        pids = {"nats-server": server.process.pid, **{k: p.pid for k, p in swarm.procs.items()}}
        yield Standing(server.url, f"http://127.0.0.1:{port}", pids)
    finally:
        swarm.stop()
        server.stop()


def wait_serving(st: Standing, model: str, wait_s: float) -> None:
    """Until the gateway answers a completion of ``model`` (the plan is out, a router
    and its pipeline serve it, the gateway sees it)."""
    deadline = time.monotonic() + wait_s
    body = {"model": model, "prompt": "ready?", "max_tokens": 1}
    last = ""
    while time.monotonic() < deadline:
        try:
            r = httpx.post(f"{st.base}/v1/completions", json=body, timeout=TIMEOUT_S)
            if r.status_code == 200:
                return
            last = r.text
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.2)
    raise RuntimeError(f"the gateway never served {model}: {last}")


# -- CPU of the swarm's processes -------------------------------------------------------
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # the name may hold spaces
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def role(label: str) -> str:
    """A process's part of the CPU table."""
    if label.startswith("router"):
        return "routers"
    if label.startswith("node"):
        return "nodes"
    if label in ("gateway", "nats-server"):
        return label
    return "other services"


def cores(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Cores used per role between two readings of every process's CPU seconds."""
    used: dict[str, float] = {}
    for label, start in before.items():
        r = role(label)
        used[r] = used.get(r, 0.0) + (after.get(label, start) - start) / seconds
    return {r: round(c, 2) for r, c in sorted(used.items())}


# -- the toy model: latency ---------------------------------------------------------------
def asks(url: str, model: str, tokens: int, count: int) -> list[Ask]:
    """``count`` prompts with the text a direct request gets for each."""

    async def expected() -> list[Ask]:
        nc = await nats.connect(url)
        try:
            out = []
            for i in range(count):
                body = completion_body(model, f"through the front door, prompt {i}", tokens)
                text = await ask_direct(nc, Ask(model, body, ""))
                if text is None:
                    raise RuntimeError(f"the swarm did not answer prompt {i} directly")
                out.append(Ask(model, body, text))
            return out
        finally:
            await nc.close()

    result: list[Ask] = run_on_uvloop(expected())
    return result


def _figures(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "p50": round(percentile(ordered, 0.50) * 1e6, 1),
        "p99": round(percentile(ordered, 0.99) * 1e6, 1),
        "samples": len(ordered),
    }


async def _latency(st: Standing, todo: list[Ask], samples: int, warmup: int) -> dict[str, Any]:
    nc = await nats.connect(st.url)
    raw = await Http1.open(st.base)
    raws = [Http1.post_bytes(st.base, "/v1/completions", a.body) for a in todo]
    taken: dict[str, list[float]] = {p: [] for p in PATHS}
    wrong = dict.fromkeys(PATHS, 0)
    failed = dict.fromkeys(PATHS, 0)
    headers = {"content-type": "application/json"}
    try:
        async with httpx.AsyncClient(base_url=st.base, timeout=TIMEOUT_S) as hx:

            async def one(path: str, k: int) -> str | None:
                if path == "direct":
                    return await ask_direct(nc, todo[k])
                if path == "gateway":
                    status, body = await raw.send(raws[k])
                    return text_of_completion(body) if status == 200 else None
                r = await hx.post("/v1/completions", content=todo[k].body, headers=headers)
                return text_of_completion(r.content) if r.status_code == 200 else None

            for i in range(warmup + samples):
                k = i % len(todo)
                turn = i % len(PATHS)
                for path in PATHS[turn:] + PATHS[:turn]:
                    t0 = time.perf_counter()
                    text = await one(path, k)
                    took = time.perf_counter() - t0
                    if i < warmup:
                        continue
                    if text is None:
                        failed[path] += 1
                    elif text != todo[k].expected:
                        wrong[path] += 1
                    else:
                        taken[path].append(took)
    finally:
        await raw.close()
        await nc.close()
    out: dict[str, Any] = {f"{p}_us": _figures(taken[p]) for p in PATHS}
    for q in ("p50", "p99"):
        out[f"added_{q}_us"] = round(out["gateway_us"][q] - out["direct_us"][q], 1)
        out[f"added_{q}_us_httpx"] = round(out["gateway_httpx_us"][q] - out["direct_us"][q], 1)
    out["wrong"] = wrong
    out["failed"] = failed
    return out


# -- the toy model: capacity --------------------------------------------------------------
def _window(workers: Workers, seconds: float, clients: int, pids: dict[str, int]) -> dict[str, Any]:
    start, end = workers.start(seconds, clients)
    time.sleep(max(0.0, start - time.monotonic()))
    before = {label: cpu_s(pid) for label, pid in pids.items()}
    t0 = time.monotonic()
    time.sleep(max(0.0, end - time.monotonic()))
    after = {label: cpu_s(pid) for label, pid in pids.items()}
    used = cores(before, after, time.monotonic() - t0)
    tally = workers.collect()
    used["load generators"] = round(tally.cpu_s / seconds, 2)
    return {
        "clients": clients,
        "rps": round(tally.ok / seconds, 1),
        "ok": tally.ok,
        "wrong": tally.wrong,
        "failed": tally.failed,
        "cores": used,
    }


def _median_round(figures: list[dict[str, Any]]) -> dict[str, Any]:
    by_rps = sorted(figures, key=lambda f: float(f["rps"]))
    return {**by_rps[len(by_rps) // 2], "rounds_rps": [f["rps"] for f in figures]}


GROWING = 1.1  # the most clients gave this much more than the level below: not saturated


def _capacity(
    st: Standing,
    todo: list[Ask],
    env: dict[str, str],
    *,
    clients: tuple[int, ...],
    processes: int,
    seconds: float,
    rounds: int,
) -> dict[str, Any]:
    """Each path at each number of clients, the paths and levels taking turns, round
    after round. A path's capacity is its best level's median round; the ratio is the
    median over rounds of the best gateway level ÷ the best direct level."""
    started: dict[str, Workers] = {}
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {
        path: {n: [] for n in clients} for path in ("direct", "gateway")
    }
    try:
        started["direct"] = Workers("nats", st.url, todo, count=processes, env=env)
        started["gateway"] = Workers("http", st.base, todo, count=processes, env=env)
        for workers in started.values():
            _window(workers, min(seconds, 0.5), clients[0], {})  # warm up
        for _ in range(rounds):
            for n in clients:
                for label, workers in started.items():
                    runs[label][n].append(_window(workers, seconds, n, st.pids))
    finally:
        for workers in started.values():
            workers.stop()
    out: dict[str, Any] = {}
    best_by_round: dict[str, list[float]] = {}
    for label, levels in runs.items():
        medians = [_median_round(levels[n]) for n in clients]
        best = max(medians, key=lambda f: float(f["rps"]))
        growing = len(medians) > 1 and medians[-1]["rps"] > GROWING * medians[-2]["rps"]
        out[label] = {
            "rps": best["rps"],
            "clients": best["clients"],
            "growing": growing,
            "levels": medians,
        }
        best_by_round[label] = [max(levels[n][i]["rps"] for n in clients) for i in range(rounds)]
    ratios = [
        round(g / d, 3) if d else 0.0
        for d, g in zip(best_by_round["direct"], best_by_round["gateway"], strict=True)
    ]
    every = [f for levels in runs.values() for figures in levels.values() for f in figures]
    out["ratio_rounds"] = ratios
    out["ratio"] = sorted(ratios)[len(ratios) // 2]
    out["wrong"] = sum(f["wrong"] for f in every)
    out["failed"] = sum(f["failed"] for f in every)
    out["clients"] = list(clients)
    out["processes"] = processes
    out["seconds"] = seconds
    out["rounds"] = rounds
    return out


def run_toy(
    *,
    samples: int,
    warmup: int,
    clients: tuple[int, ...],
    processes: int,
    seconds: float,
    rounds: int,
) -> dict[str, Any]:
    """The toy model's part: latency added, then capacities, on one standing swarm."""
    env = bench_env(OPENBLAS_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp, standing(Path(tmp), toy_topology(), env) as st:
        wait_serving(st, TOY_MODEL, 120.0)
        todo = asks(st.url, TOY_MODEL, TOY_TOKENS, PROMPTS)
        latency = run_on_uvloop(_latency(st, todo, samples, warmup))
        capacity = (
            _capacity(
                st,
                todo,
                env,
                clients=clients,
                processes=processes,
                seconds=seconds,
                rounds=rounds,
            )
            if rounds
            else None
        )
    return {
        "model": TOY_MODEL,
        "topology": TOY_TOPOLOGY,
        "tokens": TOY_TOKENS,
        "prompts": PROMPTS,
        "latency": latency,
        "capacity": capacity,
    }


def run_gateway_bench(
    *,
    samples: int = 2000,
    warmup: int = 100,
    clients: tuple[int, ...] = (32, 128, 512),
    processes: int = 2,
    seconds: float = 4.0,
    rounds: int = 3,
    stream: bool = True,
    stream_tokens: int = 48,
    stream_rounds: int = 5,
) -> dict[str, Any]:
    """Both parts (``stream=False``: the toy model's only), the failed checks and the
    verdicts."""
    report: dict[str, Any] = {
        "toy": run_toy(
            samples=samples,
            warmup=warmup,
            clients=clients,
            processes=processes,
            seconds=seconds,
            rounds=rounds,
        )
    }
    if stream:
        from hecate.dev.bench.gateway_stream import run_stream

        report["stream"] = run_stream(tokens=stream_tokens, rounds=stream_rounds)
    else:
        report["stream"] = {"skipped": "not asked for (toy model only)"}
    wrong = wrong_answers(report)
    report["failed_checks"] = [f"{wrong} wrong answers"] if wrong else []
    report["verdicts"] = {k: said(v) for k, v in judge(report).items()}
    report["targets_us"] = dict(TARGETS_US)
    return report
