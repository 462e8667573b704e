"""The chaos section: parts of the swarm killed under load (``hecate chaos all``)."""

# Prose for people: its dashes are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from hecate.dev.bench.report.markdown import Doc, Target, num, provenance, table, verdict
from hecate.dev.chaos.acceptance import Expect, evidence_of, judge
from hecate.dev.chaos.scenarios import SCENARIOS

TIMELINES = ("node-kill", "llm-kill")  # the scenarios whose timeline the report draws
EVIDENCE = {
    "failover_events": "{:,.0f} failovers",
    "client_retries": "{:,.0f} retries",
    "recover_s": "recovered in {:.2f} s",
    "answered_during_outages": "≥ {:,.0f} answered inside each outage",
}
NAMED = {
    "failover_events": "failovers",
    "client_retries": "client retries",
    "recover_s": "a non-zero recover s",
    "answered_during_outages": "requests answered inside each outage",
}


def _expect(s: Doc) -> Expect:
    """What the scenario must show, as the code says today (a scenario this hecate no
    longer knows must show nothing more than no loss and no error)."""
    known = SCENARIOS.get(s["scenario"])
    return known.expect if known is not None else Expect((), "")


def _verdicts(s: Doc) -> dict[str, bool]:
    """Judged from the saved figures by the same rule ``hecate chaos`` applies."""
    return judge(s, _expect(s))


def _accepted(s: Doc) -> bool:
    return all(_verdicts(s).values())


def _acceptance(s: Doc) -> str:
    failed = [name.replace("_", " ") for name, ok in _verdicts(s).items() if not ok]
    return verdict(not failed) + (f" ({'; '.join(failed)})" if failed else "")


def _evidence(s: Doc) -> str:
    seen = evidence_of(s)
    shown = [EVIDENCE[name].format(seen.get(name, 0)) for name in _expect(s).evidence]
    return "; ".join(shown) or "–"


def _checks(s: Doc) -> str:
    if not s["checks"]:
        return "–"
    return "; ".join(
        ("" if ok else "**not** ") + name.replace("_", " ") for name, ok in s["checks"].items()
    )


def _retries(s: Doc) -> str:
    n = int(evidence_of(s).get("client_retries", 0))
    return f"{n:,} time{'' if n == 1 else 's'}"


def _seconds(ms: float) -> str:
    return f"{num(ms / 1000, 2)} s"


def _where(s: Doc) -> str:
    """Why a scenario's figures are what they are, with this run's numbers."""
    name, notes = s["scenario"], s["notes"]
    failovers = int(evidence_of(s).get("failover_events", 0))
    recovered = (
        f"recovered in {num(s['recover_s'], 2)} s"
        if s["recover_s"]
        else "no request failed or took 3x the pre-fault p99"
    )
    worst = f"max {num(s['max_ms'], 1)} ms, {recovered}"
    if name == "node-kill":
        return (
            "the requests in flight on the killed node fail over to the replica within "
            "milliseconds (no-responders); one killed while computing waits for telemetry's "
            f"node-down. This run: {failovers} failovers, {worst}."
        )
    if name == "router-kill":
        return (
            "the router is frozen a moment before it is killed, so that it certainly "
            "holds requests when it dies; each is answered only when its caller's own "
            "timeout fires and the retry lands on the other router: the maximum here, "
            f"{_seconds(s['max_ms'])}, is that timeout, the retry's pause and the answer."
        )
    if name == "control-plane":
        return (
            "the planner, telemetry and the breaker service are each killed and restarted "
            f"in turn; routers serve from their last snapshots meanwhile ({worst})."
        )
    if name == "nats-restart":
        survived = s["checks"].get("plan_survived")
        return (
            "the server is down about a second; the requests in flight wait it out (the "
            "routers resend what they hold once reconnected; callers retried "
            f"{_retries(s)}; max {_seconds(s['max_ms'])}). The plan in JetStream "
            f"{'survived' if survived else '**did not survive**'} the restart. A restart "
            "once turned into wrong verdicts (telemetry counted its own cut-off time as "
            "the nodes' silence; routers met no-responders from nodes not yet "
            "resubscribed); both are fixed, and this scenario keeps them fixed."
        )
    if name == "sick-node":
        seen = notes.get("telemetry_latency_ms_while_slow")
        delay = notes.get("injected_delay_ms")
        telemetry = (
            f"telemetry's latency for it rose to {num(seen, 1)} ms (stages delayed "
            f"{num(delay, 0)} ms)"
            if seen is not None and delay is not None
            else "telemetry's view of it was not measured"
        )
        before = notes.get("share_via_node_before")
        during = notes.get("share_via_node_while_slow")
        closed = notes.get("breaker_closed_s_after_heal")
        opened = s["checks"].get("breaker_opened")
        share = (
            f"the node's share of answers went from {num(before, 3)} to {num(during, 3)}"
            if before is not None and during is not None
            else "the node's share of answers was not measured"
        )
        heal = (
            f"one probe closed it {num(closed, 2)} s after the heal"
            if closed is not None
            else "it did **not** close after the heal"
        )
        return (
            f"10x slower, {telemetry} and {share}; answering errors, its circuit "
            f"{'opened' if opened else '**did not open**'} (the chaos swarm runs the breaker "
            f"with `--failure-threshold 3 --cooldown-s 2`); healed, {heal}. Error replies "
            f"fail over to the replica: callers saw {s['errors']:,} errors."
        )
    if name == "nats-cluster":
        return (
            "the server killed is the callers' own; they and the services connected to "
            "it reconnect to the other two (clients are given the whole list); a request "
            "in flight waits for its caller's connection to move, or for a stage timeout "
            f"where a node's did (callers retried {_retries(s)}; max "
            f"{_seconds(s['max_ms'])}). "
            "The plan stays readable from the two survivors (KV with 3 replicas)."
        )
    if name == "llm-kill":
        before = _finished_before_fault(s)
        usual = (
            f"against {_seconds(max(before))} for the slowest before the fault"
            if before
            else "no generation finished before the fault to compare with"
        )
        return (
            "a generation running through the killed stage is replayed onto the replica "
            f"(max {_seconds(s['max_ms'])}, {usual}); {failovers} failovers."
        )
    return worst + "."


def _finished_before_fault(s: Doc) -> list[float]:
    """Latencies (ms) of the requests that were answered right before the first fault,
    from the saved timeline (empty without one)."""
    t = s.get("timeline")
    if not t:
        return []
    return [
        latency
        for started, latency, status in zip(
            t["started_s"], t["latency_ms"], t["status"], strict=True
        )
        if status == "ok" and started + latency / 1000 < 0
    ]


def _caption(s: Doc) -> str:
    right = "all answered right" if s["ok"] == s["sent"] else f"{s['ok']:,} answered right"
    return (
        f"{s['scenario']}: {s['sent']:,} requests, {right} ({s['errors']:,} errors, "
        f"{s['lost']:,} lost, {s['wrong']:,} wrong, {s.get('degraded', 0):,} degraded); "
        f"{int(evidence_of(s).get('failover_events', 0))} failovers; max latency "
        f"{num(s['max_ms'], 1)} ms."
    )


def section_chaos(env: Doc, img: str) -> tuple[str, list[Target]]:
    r = env["report"]
    ran = [s for s in r["scenarios"] if "skipped" not in s]
    skipped = [s for s in r["scenarios"] if "skipped" in s]
    rows = [
        [
            s["scenario"],
            f"{s['sent']:,}",
            f"{s['ok']:,}",
            f"{s['errors']:,}",
            f"{s['lost']:,}",
            f"{s['wrong']:,}",
            f"{s.get('degraded', 0):,}",
            num(s["p99_ms"], 1),
            num(s["max_ms"], 1),
            num(s["recover_s"], 2),
            _evidence(s),
            _checks(s),
            _acceptance(s),
        ]
        for s in ran
    ]
    results = table(
        [
            "scenario",
            "sent",
            "ok",
            "errors",
            "lost",
            "wrong",
            "degraded",
            "p99 ms",
            "max ms",
            "recover s",
            "the fault hit live traffic",
            "checks",
            "acceptance",
        ],
        rows,
    )
    t = r.get("timing", {})
    timing = (
        f"{num(t['warm'], 1)} s of load, the fault, its heal {num(t['fault'], 1)} s later, "
        f"{num(t['settle'], 1)} s more load"
        if t
        else "load, the fault, its heal, more load"
    )
    short = " (`--short` timings)" if r.get("short") else ""
    not_run = "".join(f"\n* `{s['scenario']}`: not run, {s['skipped']}." for s in skipped)
    named = {s["scenario"] for s in r["scenarios"]}
    absent = [n for n in SCENARIOS if n not in named]
    if absent:
        listed = ", ".join(f"`{n}`" for n in absent)
        not_run += f"\n* not in this run (the command named its scenarios): {listed}."
    where = "\n".join(f"* `{s['scenario']}`: {_where(s)}" for s in ran)
    expects = "\n".join(
        f"* `{n}`: {' and '.join(NAMED[e] for e in x.expect.evidence)}, because "
        f"{x.expect.because}; explicit "
        "errors allowed: "
        + ("; ".join(f"`{c}` ({why})" for c, why in x.expect.allowed_errors.items()) or "none")
        + "."
        for n, x in SCENARIOS.items()
        if n in {s["scenario"] for s in ran}
    )
    pictures = "".join(
        f"\n![{s['scenario']}: every request's latency around the fault]"
        f"({img}/chaos-{s['scenario']}.png)\n\n{_caption(s)}\n"
        for s in ran
        if s["scenario"] in TIMELINES and "timeline" in s
    )
    accepted = bool(ran) and all(_accepted(s) for s in ran)
    text = f"""## Chaos: killing parts of the swarm under load

{provenance(env)}
The scenarios are described in `devtools/hecate/dev/chaos/scenarios.py`; `make chaos`
runs them alone and fails if any scenario fails its acceptance. Each scenario is a
fresh swarm of real processes on loopback (toy model: 2 routers, telemetry, planner,
breaker, 7 nodes on `chaos/topologies/chaos.json`; `llm-kill`: SmolLM2 on
`chaos/topologies/smollm2.json`), 4 callers (2 for SmolLM2) sending one request at a
time through `HecateClient` (2 s timeout, 20 s for SmolLM2, up to 4 attempts),
{timing}{short}.

{results}
{not_run}

A request is `lost` when its last send got no reply at all, whatever the client
decided afterwards (its own breaker refusing to try again does not turn silence into an
error); an `error` is an explicit error reply from the swarm; `degraded`: answered by
the reserve model. `p99`/`max`: latency of the requests that overlapped the fault
window; `recover s`: from the fault until the end of the last request that failed or
took more than 3x the pre-fault p99 (0: none did). Acceptance: nothing lost or wrong,
no explicit error but those the scenario allows (with its reason), no degraded answer
while an intact pipeline of the base model was up, every check true, and the evidence
the scenario names that its fault hit live traffic (a fault that hit nothing proves
nothing): {verdict(accepted)} in {sum(1 for s in ran if _accepted(s))} of {len(ran)}
scenarios run. What each scenario must show:

{expects}

Where the time goes:

{where}

Latency timelines, every request at the time it started (seconds from the first
fault), the faults and heals marked, the recovery window shaded:
{pictures}"""
    return text, [
        Target(
            "chaos: every scenario accepted (nothing lost or wrong, no unexplained "
            "error, no needless degraded answer, its fault shown to hit live traffic)",
            f"{sum(1 for s in ran if _accepted(s))} of {len(ran)} accepted; "
            + ", ".join(
                f"{sum(s.get(k, 0) for s in ran):,} {k}"
                for k in ("lost", "wrong", "errors", "degraded")
            ),
            accepted if ran else None,
        )
    ]
