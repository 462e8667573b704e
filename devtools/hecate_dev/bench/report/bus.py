"""The bus section: routed against raw NATS, closed loop and offered load (``hecate bench bus``)."""

# Prose for people: its dashes and multiplication signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from hecate_dev.bench.report.markdown import Doc, Target, num, provenance, table, verdict
from hecate_dev.bench.results import load
from hecate_dev.bench.results_bus import BusResult

BUS_TARGET_RATIO = 0.4  # routed 1-stage throughput / raw request-reply
SECURE_TARGET_RATIO = 0.8  # routed 1-stage, locked-down bus / the same on the open bus
SECURE_TARGET = "locked-down bus ≥ 0.8× open bus, routed 1-stage capacity (open loop)"
ROUTER_COST_TARGET = (
    "locked-down bus ≥ 0.8× open bus, a router's capacity on its own core "
    "(its CPU per routed reply)"
)
PATH_COST_TARGET = (
    "locked-down bus ≥ 0.8× open bus, the whole path's CPU per routed reply "
    "(server, router, node and caller together, on one machine)"
)
ROLE_NAMES = {  # cpu_us keys, in the table's order
    "server": "nats-server",
    "router": "router",
    "nodes": "node(s) / echo",
    "generator": "generator",
    "total": "all",
}
# What the locked-down configuration is, as deployed (bus_setup.SECURE).
SECURE_SETUP = (
    "the layout `hecate up --secure` and `deploy/` run: TLS between every process and the "
    "server; the services in one NATS account and each tenant in an account of its own "
    "that imports the service (`deploy/nats/accounts.conf`); the router and each node "
    "logged in as a user of their own, the server checking every publish and "
    "subscription against the permissions the wire contract derives; the load sent by a "
    "tenant's user from its own account, so the server stamps each request with that "
    "account (`Nats-Request-Info`) and the router takes the tenant from it "
    "(`--tenant-from bus`), refusing a request no account vouches for"
)

BUS_ROWS = (  # key, description, ratio of its capacity to raw's
    ("raw", "raw NATS request/reply (echo)", None),
    ("routed_1", "routed, 1 stage (router calls the stage)", "ratio_1"),
    ("routed_3", "routed, 3 stages, router calls each stage (`hop`)", "ratio_3"),
    ("routed_3_chain", "routed, 3 stages, nodes forward (`chain`)", "ratio_3_chain"),
    (
        "routed_1_secure",
        "routed, 1 stage, locked-down bus (TLS, an account per tenant, a user per process)",
        "ratio_1_secure",
    ),
)
SWEEP_NAMES = {
    "raw": "raw NATS (echo)",
    "routed_1": "routed, 1 stage",
    "routed_3": "routed, 3 stages, hop",
    "routed_3_chain": "routed, 3 stages, chained",
    "routed_1_secure": "routed, 1 stage, locked-down bus",
}
BOUND = {"exact": "", "at_most": "≤ ", "at_least": "≥ ", "unknown": "? "}


def judged(value: float | None, kind: str, target: float) -> bool | None:
    """A ratio against its target, as far as the ratio is known: one that is only an
    upper bound can fail the target but not meet it, a lower bound the reverse."""
    if value is None:
        return None
    if kind == "exact":
        return value >= target
    if kind == "at_most":
        return False if value < target else None
    if kind == "at_least":
        return True if value >= target else None
    return None


def judge_secure(r: BusResult) -> bool | None:
    """The locked-down bus against the open one (:data:`SECURE_TARGET_RATIO`), as far
    as the ratio is known; ``None`` when the run did not measure both."""
    value, kind = r.ratio("secure_over_open")
    return judged(value, kind, SECURE_TARGET_RATIO)


def judge_router_cost(r: BusResult) -> bool | None:
    """The router's CPU per routed reply, open ÷ locked-down bus, against
    :data:`SECURE_TARGET_RATIO`; ``None`` when the run did not measure both."""
    value = r.router_cost_secure_over_open
    return judged(value, "exact", SECURE_TARGET_RATIO)


def judge_path_cost(r: BusResult) -> bool | None:
    """Every process's CPU per routed reply together, open ÷ locked-down bus, against
    the same :data:`SECURE_TARGET_RATIO`: judged beside the router's own, since one
    machine running them all pays the server's and the callers' TLS too; ``None``
    when the run did not measure both."""
    return judged(r.path_cost_secure_over_open, "exact", SECURE_TARGET_RATIO)


def _costs(r: BusResult) -> str:
    """Where each configuration's CPU goes, per correct reply, and the locked-down bus's
    price in it."""
    loops = [(label, f) for key, label, _ in BUS_ROWS if (f := r.closed(key)) and f.cpu_us]
    if not loops:
        return ""
    rows = [
        [label, *("–" if (v := f.cpu_us.get(role)) is None else num(v, 0) for role in ROLE_NAMES)]
        for label, f in loops
    ]
    costs = table(["configuration", *(f"{name} µs" for name in ROLE_NAMES.values())], rows)
    verdicts = ""
    router, path = r.router_cost_secure_over_open, r.path_cost_secure_over_open
    if router is not None:
        verdicts = (
            f"A router's CPU per routed reply on the open bus ÷ on the locked-down bus is "
            f"{num(router, 3)}: the capacity of a router with a core of its own, as deployed, "
            "where the server and the callers run on machines of their own; against the "
            f"issue's target (≥ {SECURE_TARGET_RATIO}×): {verdict(judge_router_cost(r))}."
        )
    if path is not None:
        verdicts += (
            f" For every process of the path together the same quotient is {num(path, 3)}: "
            "the locked-down bus's price where one machine runs them all, as this bench "
            f"does; against the same target: {verdict(judge_path_cost(r))}."
        )
    return f"""### Where the CPU goes: per correct reply, by process

Read from `/proc` around each closed-loop round (user plus system time of each process,
÷ the round's correct replies; each figure the median over the rounds). The generator is
the process driving the closed loop. On the locked-down bus TLS is paid by every process
that speaks to the server, the server among them, and the cross-account import (the
reply mapping and the `Nats-Request-Info` stamp) by the server.

{costs}

{verdicts}
"""


def shown_ratio(r: BusResult, name: str, digits: int = 2) -> str:
    value, kind = r.ratio(name)
    if value is None:
        return "–"
    return BOUND.get(kind, "") + num(value, digits)


def _capacity_row(r: BusResult, key: str, label: str, ratio: str | None) -> list[str]:
    cap = r.capacity[key]
    rps = "none served in full" if cap.rps is None else num(cap.rps, 0)
    if cap.rps is not None and not cap.exact:
        rps = "≥ " + rps
    failed = "–" if cap.failed_at_rps is None else num(cap.failed_at_rps, 0)
    lag = cap.send_lag_p99_us_at_failure
    lag_text = "–" if lag is None else num(lag / 1000, 2)
    if lag is not None and lag > r.meta.lagging_us:
        lag_text += " (generators lagging)"
    shown = "1" if ratio is None else shown_ratio(r, ratio)
    if ratio == "ratio_1":
        shown = f"**{shown}**"
    return [label, rps, failed, lag_text, shown]


def _sweep(r: BusResult, img: str) -> str:
    meta = r.meta
    sweep = r.sweep or {}
    if not sweep:
        return "The open-loop sweep did not run in this report.\n"
    blocks = []
    for label, points in sweep.items():
        rows = [
            [
                num(p.offered_rps, 0),
                num(p.achieved_rps, 0),
                num(p.p50_us / 1000, 2),
                ("≥ " if p.p99_capped else "") + num(p.p99_us / 1000, 2),
                f"{p.failed:,}",
                f"{p.timed_out:,}",
                num(p.send_lag_p99_us / 1000, 2),
                "yes" if p.served_in_full else "**no**",
            ]
            for p in points
        ]
        header = [
            "offered req/s",
            "achieved req/s",
            "p50 ms",
            "p99 ms",
            "failed",
            "timed out",
            "send lag p99 ms",
            "served in full",
        ]
        blocks.append(f"{SWEEP_NAMES.get(label, label)}:\n\n{table(header, rows)}")
    tables = "\n\n".join(blocks)
    return f"""### Offered load: every rate tried, open loop

Each configuration's rates as the capacity search offered them ({meta.sweep_seconds} s
each), in order of rate. A request that fails or gets no reply within
{num(meta.sweep_timeout_s, 1)} s counts as that timeout in the percentiles (≥ in the
table: p99 is at that bound, the real figure is higher). Achieved throughput counts
correct replies that arrived within the offered window. The send lag column is how late
the generators themselves sent (they share the cores with the server and the services).

{tables}

![throughput and p99 latency against offered load, raw NATS beside routed]({img}/bench-bus-load.png)
"""


def _capacities(r: BusResult) -> str:
    meta = r.meta
    if not r.capacity or meta.sweep is None:
        return (
            "The open-loop capacity search did not run in this report, so no throughput "
            "ratio was measured.\n"
        )
    rule = meta.served_in_full
    sweep = meta.sweep
    rows = [
        _capacity_row(r, key, label, ratio) for key, label, ratio in BUS_ROWS if key in r.capacity
    ]
    caps = table(
        [
            "configuration",
            "capacity req/s",
            "first rate above it that failed",
            "generators' send lag p99 there (ms)",
            "÷ raw",
        ],
        rows,
    )
    secure = ""
    if r.secure_over_open is not None:
        secure = (
            f"On the locked-down bus ({SECURE_SETUP}), routed 1-stage capacity is "
            f"{shown_ratio(r, 'secure_over_open', 3)}× the same configuration's on the open "
            "bus, both searched in this run and taking turns rate by rate; against the "
            f"issue's target (≥ {SECURE_TARGET_RATIO}×): {verdict(judge_secure(r))}."
        )
    return f"""### Capacity: the highest offered rate served in full

Every ratio in this section and in the headline is a ratio of these capacities, not of
the closed loop's figures. Load is *offered* at a fixed rate, whatever the replies do,
by {meta.generators} generator processes per configuration (each on uvloop, sharing
one schedule: `devtools/hecate_dev/bench/generators.py`), and a request's latency is counted
from its **scheduled** send time, so a generator that falls behind charges its own lag
to the figures (no coordinated omission). A rate is **served in full** when at least
{rule.ok_share:.0%} of the requests offered got a correct reply within
{num(meta.sweep_timeout_s, 1)} s and p99 from the scheduled send is at most
{num(rule.p99_bound_ms, 0)} ms (failed and lost requests counting as the timeout). Over
a {meta.sweep_seconds} s window a rate above capacity builds a queue whose p99 grows
with the excess, so that bound also caps how far past the true capacity a served rate can
be. The search (`devtools/hecate_dev/bench/openloop.py`, `CapacitySearch`) offers
{", ".join(f"{f:.0%}" for f in sweep.low)} of the configuration's closed-loop figure
for the latency curve, then climbs from {sweep.start:.0%} of it by ×{sweep.step} until
{sweep.misses} rate(s) in a row fail, then bisects (geometrically, at most {sweep.refine}
times) between the best rate served and the failure above it until they are within
{(sweep.resolution - 1):.0%} of each other; the configurations take turns rate
by rate.
A capacity marked ≥ is only a floor: the search reached its ceiling, or the generators
were more than {num(meta.lagging_us / 1000, 0)} ms late (half the p99 bound) at the
rate that failed, so the failure may be theirs. A ratio whose divisor is such a floor is
marked ≤, one whose dividend is, ≥; a verdict is given only where that bound decides it.

{caps}

{secure}
"""


def section_bus(env: Doc, img: str) -> tuple[str, list[Target]]:
    r = load(env["report"], BusResult)
    meta = r.meta
    loops = [(label, f) for key, label, _ in BUS_ROWS if (f := r.closed(key)) is not None]
    rows = [[label, num(f.rps, 0), num(f.p50_us, 0), num(f.p99_us, 0)] for label, f in loops]
    closed = table(["configuration", "req/s (correct replies)", "p50 µs", "p99 µs"], rows)
    failures = sum(f.failures for _, f in loops)
    ratio_1, kind = r.ratio_1, r.ratio_1_is or "unknown"
    met = judged(ratio_1, kind, BUS_TARGET_RATIO)
    figure = "–" if ratio_1 is None else f"{BOUND.get(kind, '')}{num(ratio_1, 3)}× raw"
    caps = r.capacity
    raw_cap = caps["raw"].rps if "raw" in caps else None
    raw_note = "" if raw_cap is None else f"; raw NATS {num(raw_cap, 0)} req/s in full"
    chain = ""
    hop3 = caps["routed_3"].rps if "routed_3" in caps else None
    chain3 = caps["routed_3_chain"].rps if "routed_3_chain" in caps else None
    if hop3 and chain3:
        gain = chain3 / hop3 - 1
        chain = (
            f"Chained dispatch {'gains' if gain >= 0 else 'loses'} {abs(gain):.0%} of capacity "
            "against the router calling each stage at 3 stages here; on this machine every "
            "process competes for the same cores, so saving router hops saves less than it "
            "would with nodes on their own machines."
        )
    cores = env.get("cores", "the")
    text = f"""## The bus: routed requests against raw NATS, same run

{provenance(env)}
What runs, each in its own process, on one embedded nats-server per configuration: the
load generators, and either an echo responder (**raw**) or one router plus the nodes of a
1-stage or 3-stage pipeline ({meta.layers} layers in all); 256-byte payload for raw, a
short JSON `InferRequest` for routed. The plan is written to KV directly; no telemetry
service runs. Every process runs on uvloop, the echo and the load generators included.
Nodes here run the `{meta.executor}` executor: with `null` (no arithmetic) a ratio
prices the routing path: decoding, choosing, dispatching, correlating, replying, with
failure detection (no-responders, error replies, timeout sweep), failover and in-flight
accounting all live. Only correct replies count as throughput. `--quick` shortens every
phase; `--executor toy` includes the built-in model's compute.

Against the issue's target (routed 1-stage throughput ≥ {BUS_TARGET_RATIO}× raw with
failure handling intact, as a ratio of capacities): {verdict(met)} ({figure}{raw_note}).

{_capacities(r)}
{chain}

### Closed loop: latency at a fixed concurrency

One generator process (this one) keeps {meta.inflight} requests in flight; every
configuration stands at once and they take turns for {meta.rounds} round(s) of
{meta.seconds} s each after a 0.5 s warm-up; each figure is the configuration's median
round. A closed loop slows down whenever replies do, and one process waiting on a
request/reply future per request is the limit of its own raw figure, so no ratio is
taken from this table: it shows latency under {meta.inflight} requests in flight, on
{cores} cores shared by every process and the server.

{closed}

Failed requests in the closed loop: {failures:,}.

{_costs(r)}
Changes that moved these figures, each measured with this command at the time (the
history of this file has the figures): skipping span creation and trace-context
extraction when nothing exports, together with a cheaper toy embedding; uvloop in every
service; the router's status computed only when `$SRV.STATS` asks; and the `null`
executor for this benchmark.

{_sweep(r, img)}"""
    secure_value, secure_kind = r.ratio("secure_over_open")
    secure_figure = (
        "not measured"
        if secure_value is None
        else f"{BOUND.get(secure_kind, '')}{num(secure_value, 3)}× open"
    )
    return text, [
        Target("routed 1-stage capacity ≥ 0.4× raw NATS capacity (open loop)", figure, met),
        Target(SECURE_TARGET, secure_figure, judge_secure(r)),
        Target(
            ROUTER_COST_TARGET,
            "not measured"
            if r.router_cost_secure_over_open is None
            else f"{num(r.router_cost_secure_over_open, 3)}× open",
            judge_router_cost(r),
        ),
        Target(
            PATH_COST_TARGET,
            "not measured"
            if r.path_cost_secure_over_open is None
            else f"{num(r.path_cost_secure_over_open, 3)}× open",
            judge_path_cost(r),
        ),
    ]
