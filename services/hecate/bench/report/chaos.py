"""The chaos section: parts of the swarm killed under load (``hecate chaos all``)."""

# Prose for people: its dashes are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from hecate.bench.report.markdown import Doc, Target, num, provenance, table, verdict
from hecate.chaos.scenarios import SCENARIOS

TIMELINES = ("node-kill", "llm-kill")  # the scenarios whose timeline the report draws


def _accepted(s: Doc) -> bool:
    return not s["lost"] and not s["wrong"] and all(s["checks"].values())


def _checks(s: Doc) -> str:
    if not s["checks"]:
        return "–"
    return "; ".join(
        ("" if ok else "**not** ") + name.replace("_", " ") for name, ok in s["checks"].items()
    )


def _seconds(ms: float) -> str:
    return f"{num(ms / 1000, 2)} s"


def _where(s: Doc) -> str:
    """Why a scenario's figures are what they are, with this run's numbers."""
    name, notes = s["scenario"], s["notes"]
    failovers = int(notes.get("failover_events", 0))
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
            "a request the dead router had taken is answered only when its caller's own "
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
            "the server is down about a second; callers wait on their timeouts and retry "
            f"(max {_seconds(s['max_ms'])}). The plan in JetStream "
            f"{'survived' if survived else '**did not survive**'} the restart. A restart "
            "once turned into wrong verdicts (telemetry counted its own cut-off time as "
            "the nodes' silence; routers met no-responders from nodes not yet "
            "resubscribed); both are fixed, and this scenario keeps them fixed."
        )
    if name == "sick-node":
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
            f"10x slower, {share}; answering errors, its circuit "
            f"{'opened' if opened else '**did not open**'} (the chaos swarm runs the breaker "
            f"with `--failure-threshold 3 --cooldown-s 2`); healed, {heal}. Error replies "
            f"fail over to the replica: callers saw {s['errors']:,} errors."
        )
    if name == "nats-cluster":
        return (
            "the callers and services connected to the killed server reconnect to the "
            "other two (clients are given the whole list); those with a request in flight "
            f"wait for their timeout (max {_seconds(s['max_ms'])}). The plan stays readable "
            "from the two survivors (KV with 3 replicas)."
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
        f"{s['lost']:,} lost, {s['wrong']:,} wrong); "
        f"{int(s['notes'].get('failover_events', 0))} failovers; max latency "
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
            num(s["p99_ms"], 1),
            num(s["max_ms"], 1),
            num(s["recover_s"], 2),
            _checks(s),
            verdict(_accepted(s)),
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
            "p99 ms",
            "max ms",
            "recover s",
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
    pictures = "".join(
        f"\n![{s['scenario']}: every request's latency around the fault]"
        f"({img}/chaos-{s['scenario']}.png)\n\n{_caption(s)}\n"
        for s in ran
        if s["scenario"] in TIMELINES and "timeline" in s
    )
    accepted = bool(ran) and all(_accepted(s) for s in ran)
    text = f"""## Chaos: killing parts of the swarm under load

{provenance(env)}
The scenarios are described in `services/hecate/chaos/scenarios.py`; `make chaos`
runs them alone and fails if any request is lost or wrong. Each scenario is a fresh
swarm of real processes on loopback (toy model: 2 routers, telemetry, planner,
breaker, 7 nodes on `examples/chaos.json`; `llm-kill`: SmolLM2 on
`examples/smollm2.json`), 4 callers (2 for SmolLM2) sending one request at a time
through `HecateClient` (2 s timeout, 20 s for SmolLM2, up to 4 attempts), {timing}{short}.

{results}
{not_run}

`p99`/`max`: latency of the requests that overlapped the fault window; `recover s`:
from the fault until the end of the last request that failed or took more than 3x the
pre-fault p99 (0: none did). Acceptance (lost = 0, wrong = 0, every check true):
{verdict(accepted)} in {sum(1 for s in ran if _accepted(s))} of {len(ran)} scenarios run.
Where the time goes:

{where}

Latency timelines, every request at the time it started (seconds from the first
fault), the faults and heals marked, the recovery window shaded:
{pictures}"""
    return text, [
        Target(
            "chaos: nothing lost or wrong in any scenario",
            f"{sum(1 for s in ran if _accepted(s))} of {len(ran)} scenarios clean",
            accepted if ran else None,
        )
    ]
