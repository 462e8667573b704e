"""The toy model's capacity in ``hecate bench gateway``: worker processes keep N
clients busy in a closed loop, on NATS directly and through the gateway in turn, at each
number of clients, round after round, every process's CPU read over each window (see
:mod:`hecate_dev.bench.gateway`)."""

from __future__ import annotations

import time
from typing import Any

from hecate_dev.bench.gateway_load import Ask, Workers
from hecate_dev.bench.gateway_swarm import Standing, cores, cpu_s


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


def capacity(
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
