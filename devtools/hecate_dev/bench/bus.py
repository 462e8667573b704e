"""``hecate bench bus``: routed requests against raw NATS request/reply, same run.

Everything runs as separate processes on one embedded nats-server per configuration: an
echo responder (the raw baseline), or one router and the nodes of a 1-stage or a
3-stage pipeline (the plan is written to KV directly, as any valid plan writer may).
Nodes run the ``null`` executor by default (no arithmetic), so a ratio prices the bus
path alone; ``--executor toy`` adds the built-in model's compute. Every process runs on
uvloop, the echo and the load generators included.

Two measurements, and only the second gives ratios:

* **Closed loop**: this process keeps ``inflight`` requests in flight for ``seconds``,
  the configurations taking turns for ``rounds`` rounds (median round reported):
  latency at a fixed concurrency. One generator process with a request/reply future
  per request is its own limit for raw NATS, so its throughput is not a capacity and
  no ratio is taken from it.
* **Capacity, open loop**: per configuration, :class:`hecate_dev.bench.openloop.CapacitySearch`
  offers fixed rates from ``generators`` processes (:mod:`hecate_dev.bench.generators`),
  latency counted from each request's scheduled send, and keeps the highest rate
  served in full (:func:`hecate_dev.bench.openloop.served_in_full`). The climb starts near
  the closed-loop figure and goes on until two rates in a row fail, so it reaches past
  raw's capacity whatever the closed loop said. The configurations take turns rate by
  rate, so a slow minute of the machine falls on all of them. Every throughput ratio
  (routed ÷ raw, secure ÷ open) is a ratio of these capacities. Only correct replies
  count, in both measurements.

``routed_1_secure`` is ``routed_1`` on the bus as deployed
(:data:`hecate_dev.bench.bus_setup.SECURE`): TLS, an account per tenant, a user per
process, the router taking the tenant from the account the server stamps, the load sent
by a tenant from its own account.
``secure_over_open`` (its capacity ÷ ``routed_1``'s) is judged against
:data:`hecate_dev.bench.report.bus.SECURE_TARGET_RATIO` in ``secure_over_open_met``.
That capacity is the whole machine's: here the server, the generators, the router and
the node share two cores, so TLS and the cross-account import are paid by the server
and the generators out of the router's CPU too. So the closed loop also reads, from
``/proc``, the CPU each process spent per correct reply (``cpu_us``: server, router,
nodes, generator, total), and ``router_cost_secure_over_open`` (the router's CPU per
reply on the open bus ÷ on the locked-down one: its capacity on a core of its own, as
deployed, where the server and the callers run on other machines) is judged against
the same target in ``router_cost_secure_over_open_met``.
"""

from __future__ import annotations

import datetime
import os
import platform
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec

from hecate_dev.bench.bus_setup import CONFIGURATIONS, Standing, median_costs, wait_ready
from hecate_dev.bench.generators import Generators, run_on_uvloop
from hecate_dev.bench.openloop import OK_SHARE, P99_BOUND_MS, CapacitySearch, served_in_full
from hecate_dev.bench.report.bus import judge_router_cost, judge_secure
from hecate_dev.bench.results_bus import BusResult

RATIOS = {  # ratio name: (numerator, denominator), both capacities
    "ratio_1": ("routed_1", "raw"),
    "ratio_3": ("routed_3", "raw"),
    "ratio_3_chain": ("routed_3_chain", "raw"),
    "ratio_1_secure": ("routed_1_secure", "raw"),
    "secure_over_open": ("routed_1_secure", "routed_1"),
}


@dataclass(frozen=True)
class Sweep:
    """How the capacity search offers load, as fractions of a configuration's
    closed-loop throughput (only a starting point: the climb goes on until two rates in
    a row fail, or ``ceiling`` times that throughput)."""

    low: tuple[float, ...] = (0.1, 0.5)  # below capacity: the latency curve
    start: float = 0.8
    step: float = 1.25
    misses: int = 2
    refine: int = 6  # at most; bisection stops once the bracket is within resolution
    resolution: float = 1.08
    ceiling: float = 20.0

    def search(self, closed_rps: float) -> CapacitySearch:
        base = max(closed_rps, 10.0)
        return CapacitySearch(
            start=base * self.start,
            step=self.step,
            misses=self.misses,
            refine=self.refine,
            resolution=self.resolution,
            low=tuple(base * f for f in self.low),
            ceiling=base * self.ceiling,
        )


SWEEP = Sweep()
QUICK_SWEEP = Sweep(low=(0.5,), start=0.8, step=1.6, misses=1, refine=0, ceiling=8.0)
GENERATORS = 2  # load generator processes per configuration for the open loop
LAGGING_US = P99_BOUND_MS * 1000 / 2  # a generator this late spent half the budget itself


def capacity(points: list[dict[str, Any]]) -> dict[str, Any]:
    """A configuration's capacity from its swept points: the highest offered rate served
    in full, and whether that is the path's limit (``exact``: a rate above it failed
    while the generators kept to their schedule) or only a floor (``at_least``: the
    search stopped at its ceiling, or the generators lagged where the path failed)."""
    served = [p["offered_rps"] for p in points if p["served_in_full"]]
    best = max(served, default=None)
    above = sorted(
        (p for p in points if not p["served_in_full"] and p["offered_rps"] > (best or 0.0)),
        key=lambda p: p["offered_rps"],
    )
    lag = above[0]["send_lag_p99_us"] if above else None
    lagging = lag is not None and lag > LAGGING_US
    return {
        "rps": best,
        "exact": bool(above) and not lagging and best is not None,
        "failed_at_rps": above[0]["offered_rps"] if above else None,
        "send_lag_p99_us_at_failure": lag,
    }


def ratio(top: dict[str, Any], bottom: dict[str, Any]) -> tuple[float | None, str]:
    """``top`` ÷ ``bottom`` capacities and what the figure is: ``exact``, ``at_most``
    (the divisor is only a floor), ``at_least`` (the dividend is), or ``unknown``."""
    if not top["rps"] or not bottom["rps"]:
        return None, "unknown"
    value = round(top["rps"] / bottom["rps"], 3)
    kind = {
        (True, True): "exact",
        (True, False): "at_most",
        (False, True): "at_least",
        (False, False): "unknown",
    }[(top["exact"], bottom["exact"])]
    return value, kind


def run_bus_bench(
    *,
    seconds: float = 3.0,
    inflight: int = 64,
    layers: int = 3,
    executor: str = "null",
    configurations: tuple[str, ...] = tuple(CONFIGURATIONS),
    sweep: Sweep | None = SWEEP,
    sweep_seconds: float = 3.0,
    timeout_s: float = 2.0,
    rounds: int = 3,
    generators: int = GENERATORS,
) -> BusResult:
    """The closed loop (``inflight`` requesters, ``seconds`` per configuration per
    round, the configurations interleaved for ``rounds`` rounds; each figure the median
    round), then, unless ``sweep`` is ``None``, every configuration's capacity in open
    loop (``sweep_seconds`` per offered rate, ``generators`` processes) and the ratios
    of those capacities."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", HECATE_LOG_LEVEL="WARNING")
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)  # measure without exporting
    out: dict[str, Any] = {}
    swept: dict[str, list[dict[str, Any]]] = {}
    setups: list[Standing] = []
    loads: dict[str, Generators] = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            # Every configuration stands at once (idle ones cost next to nothing), so
            # both measurements can interleave them: a ratio compares figures taken
            # seconds, not minutes, apart, on a machine whose speed drifts.
            for label in configurations:
                setups.append(Standing.start(label, Path(tmp), layers, executor, env))
            for st in setups:
                run_on_uvloop(wait_ready(st.url, st.subject, st.body, st.routed, st.creds))
                run_on_uvloop(st.drive(inflight, 0.5))  # warm up
            runs: dict[str, list[dict[str, Any]]] = {st.label: [] for st in setups}
            for _ in range(rounds):
                for st in setups:
                    runs[st.label].append(run_on_uvloop(st.drive(inflight, seconds)))
            for label, figures in runs.items():
                by_rps = sorted(figures, key=lambda f: f["rps"])
                out[label] = {
                    **by_rps[len(by_rps) // 2],
                    "rounds_rps": [f["rps"] for f in figures],
                    "cpu_us": median_costs([f["cpu_us"] for f in figures]),
                }
            out.update(costs(out))
            if sweep is not None:
                searches = {st.label: sweep.search(out[st.label]["rps"]) for st in setups}
                for st in setups:
                    loads[st.label] = Generators(
                        st.url,
                        st.subject,
                        st.body,
                        count=generators,
                        routed=st.routed,
                        env=env,
                        creds=st.creds,
                    )
                    swept[st.label] = []
                while True:
                    offered = False
                    for st in setups:  # one rate each, in turn
                        rate = searches[st.label].next()
                        if rate is None:
                            continue
                        offered = True
                        point = loads[st.label].offer(rate, sweep_seconds, timeout_s)
                        point["served_in_full"] = served_in_full(point)
                        searches[st.label].record(rate, point["served_in_full"])
                        swept[st.label].append(point)
                        # A backlog left by an overload must not slow the next turn:
                        # a request answered now has nothing queued ahead of it.
                        run_on_uvloop(wait_ready(st.url, st.subject, st.body, st.routed, st.creds))
                    if not offered:
                        break
        finally:
            for load in loads.values():
                load.stop()
            for st in setups:
                st.stop()
    if swept:
        out["sweep"] = {
            label: sorted(points, key=lambda p: p["offered_rps"]) for label, points in swept.items()
        }
        caps = {label: capacity(points) for label, points in swept.items()}
        out["capacity"] = caps
        out.update(ratios(caps))
    out["meta"] = {
        "inflight": inflight,
        "seconds": seconds,
        "rounds": rounds,
        "layers": layers,
        "executor": executor,
        "ratio_basis": "open-loop capacity" if swept else "none: the sweep did not run",
        "sweep": None if sweep is None else asdict(sweep),
        "sweep_seconds": sweep_seconds,
        "sweep_timeout_s": timeout_s,
        "generators": generators,
        "served_in_full": {"ok_share": OK_SHARE, "p99_bound_ms": P99_BOUND_MS},
        "lagging_us": LAGGING_US,
        "dispatch": "routed_*: the router calls each stage in turn (hop); routed_3_chain: "
        "nodes forward to each other; both correlate replies, no task per request",
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
    }
    return judged_result(out)


def ratios(caps: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every ratio of :data:`RATIOS` whose two capacities were measured, each with what
    the figure is (``<name>_is``)."""
    out: dict[str, Any] = {}
    for name, (top, bottom) in RATIOS.items():
        if top in caps and bottom in caps:
            out[name], out[f"{name}_is"] = ratio(caps[top], caps[bottom])
    return out


COSTS = {  # figure: (numerator's configuration, denominator's, role), CPU per reply
    "router_cost_secure_over_open": ("routed_1", "routed_1_secure", "router"),
    "path_cost_secure_over_open": ("routed_1", "routed_1_secure", "total"),
}


def costs(out: dict[str, Any]) -> dict[str, float]:
    """Every figure of :data:`COSTS` both closed loops measured: the open bus's CPU per
    reply ÷ the locked-down bus's, for the router alone (its capacity on a core of its
    own, as deployed, where the server and the callers run elsewhere) and for every
    process of the path together."""
    found: dict[str, float] = {}
    for name, (cheap, dear, role) in COSTS.items():
        top = out.get(cheap, {}).get("cpu_us", {}).get(role)
        bottom = out.get(dear, {}).get("cpu_us", {}).get(role)
        if top and bottom:
            found[name] = round(top / bottom, 3)
    return found


def judged_result(out: dict[str, Any]) -> BusResult:
    """The result as saved, with the locked-down bus judged against its target from its
    measured ratio (``secure_over_open_met``)."""
    result = msgspec.convert(out, BusResult)
    return msgspec.structs.replace(
        result,
        secure_over_open_met=judge_secure(result),
        router_cost_secure_over_open_met=judge_router_cost(result),
    )
