"""The chaos section: parts of the swarm killed under load (``hecate chaos all``). Each
scenario judges and explains its own saved figures
(:class:`hecate_dev.chaos.scenario.Scenario`); this module lays them out."""

# Prose for people: its dashes are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from hecate_dev.bench.report.markdown import Doc, Target, num, provenance, table, verdict
from hecate_dev.chaos import results
from hecate_dev.chaos.results import ScenarioResult
from hecate_dev.chaos.scenario import EVIDENCE
from hecate_dev.chaos.scenarios import SCENARIOS, of

# The scenarios whose timeline the report draws: a kill, the two faults that close
# nothing (a frozen process, a silent link), and a kill mid-generation.
TIMELINES = ("node-kill", "node-freeze", "node-blackhole", "llm-kill")
NAMED = {
    "failover_events": "failovers",
    "client_retries": "client retries",
    "recover_s": "a non-zero recover s",
    "answered_during_outages": "requests answered inside each outage",
    "slowed_answers": "answers that crossed the slowed link and took its added round trip",
}


def _accepted(s: ScenarioResult) -> bool:
    """Judged from the saved figures by the rule ``hecate chaos`` applies today."""
    return all(of(s.scenario).accept(s).values())


def _acceptance(s: ScenarioResult) -> str:
    failed = [name.replace("_", " ") for name, ok in of(s.scenario).accept(s).items() if not ok]
    return verdict(not failed) + (f" ({'; '.join(failed)})" if failed else "")


def _evidence(s: ScenarioResult) -> str:
    seen = s.seen()
    shown = [EVIDENCE[name].format(seen.get(name, 0)) for name in of(s.scenario).expect.evidence]
    missed = (
        f" (run {s.missed + 1} times: the fault hit no live traffic before)" if s.missed else ""
    )
    return ("; ".join(shown) or "–") + missed


def _checks(s: ScenarioResult) -> str:
    if not s.checks:
        return "–"
    return "; ".join(
        ("" if ok else "**not** ") + name.replace("_", " ") for name, ok in s.checks.items()
    )


def _caption(s: ScenarioResult) -> str:
    right = "all answered right" if s.ok == s.sent else f"{s.ok:,} answered right"
    failovers = int(s.seen().get("failover_events", 0))
    return (
        f"{s.scenario}: {s.sent:,} requests, {right} ({s.errors:,} errors, "
        f"{s.lost:,} lost, {s.wrong:,} wrong, {s.degraded:,} degraded); "
        f"{failovers} failovers; max latency {num(s.max_ms, 1)} ms."
    )


def _expects(ran: list[ScenarioResult]) -> str:
    names = {s.scenario for s in ran}
    return "\n".join(
        f"* `{n}`: {' and '.join(NAMED[e] for e in x.expect.evidence)}, because "
        f"{x.expect.because}; explicit errors allowed: "
        + ("; ".join(f"`{c}` ({why})" for c, why in x.expect.allowed_errors.items()) or "none")
        + "; failed sends allowed (retried by their callers): "
        + (
            "; ".join(f"`{c}` ({why})" for c, why in x.expect.allowed_send_failures.items())
            or "none"
        )
        + "."
        for n, x in SCENARIOS.items()
        if n in names
    )


def _failed_sends(s: ScenarioResult) -> str:
    """Every send that failed, retried or not, by code."""
    if not s.send_failures:
        return "0"
    return ", ".join(f"{n:,} {code}" for code, n in sorted(s.send_failures.items()))


def _row(s: ScenarioResult) -> list[str]:
    return [
        s.scenario,
        f"{s.sent:,}",
        f"{s.ok:,}",
        f"{s.errors:,}",
        _failed_sends(s),
        f"{s.lost:,}",
        f"{s.wrong:,}",
        f"{s.degraded:,}",
        num(s.p99_ms, 1),
        num(s.max_ms, 1),
        num(s.recover_s, 2),
        _evidence(s),
        _checks(s),
        _acceptance(s),
    ]


HEADER = [
    "scenario",
    "sent",
    "ok",
    "errors",
    "failed sends",
    "lost",
    "wrong",
    "degraded",
    "p99 ms",
    "max ms",
    "recover s",
    "the fault hit live traffic",
    "checks",
    "acceptance",
]


def section_chaos(env: Doc, img: str) -> tuple[str, list[Target]]:
    r = results.load(env["report"])
    ran = r.ran
    t = r.timing
    timing = (
        f"{num(t.warm, 1)} s of load, the fault, its heal {num(t.fault, 1)} s later, "
        f"{num(t.settle, 1)} s more load"
        if t
        else "load, the fault, its heal, more load"
    )
    short = " (`--short` timings)" if r.short else ""
    not_run = "".join(f"\n* `{s.scenario}`: not run, {s.skipped}." for s in r.skipped)
    named = {s.scenario for s in r.scenarios}
    absent = [n for n in SCENARIOS if n not in named]
    if absent:
        listed = ", ".join(f"`{n}`" for n in absent)
        not_run += f"\n* not in this run (the command named its scenarios): {listed}."
    where = "\n".join(f"* `{s.scenario}`: {of(s.scenario).explain(s)}" for s in ran)
    pictures = "".join(
        f"\n![{s.scenario}: every request's latency around the fault]"
        f"({img}/chaos-{s.scenario}.png)\n\n{_caption(s)}\n"
        for s in ran
        if s.scenario in TIMELINES and s.timeline is not None
    )
    passed = sum(1 for s in ran if _accepted(s))
    accepted = bool(ran) and passed == len(ran)
    text = f"""## Chaos: parts of the swarm killed, frozen and cut off under load

{provenance(env)}
The scenarios are described in `devtools/hecate_dev/chaos/scenarios.py` (one object
each, which judges and explains its run); `make chaos`
runs them alone and fails if any scenario fails its acceptance. Each scenario is a
fresh swarm of real processes on loopback (toy model: 2 routers, telemetry, planner,
breaker, 7 nodes on `chaos/topologies/chaos.json`; `llm-kill`: SmolLM2 on
`chaos/topologies/smollm2.json`), 4 callers (2 for SmolLM2) sending one request at a
time through `HecateClient` (2 s timeout, 20 s for SmolLM2, up to 4 attempts),
{timing}{short}.

{table(HEADER, [_row(s) for s in ran])}
{not_run}

A request is `lost` when its last send got no reply at all, whatever the client
decided afterwards (its own breaker refusing to try again does not turn silence into an
error); an `error` is an explicit error reply from the swarm; `failed sends`: every
send that was not answered with an answer, the ones its caller then retried included
(an error's code, or the client's own for silence; a hedge another send's answer made
moot is not one); `degraded`: answered by the reserve model. `p99`/`max`: latency of
the requests that overlapped the fault window; `recover s`: from the fault until the
end of the last request that failed or took more than 3x the pre-fault p99 (0: none
did). Acceptance: nothing lost or wrong, no explicit error and no failed send but those
the scenario allows (with its reason), no degraded answer
while an intact pipeline of the base model was up, every check true, and the evidence
the scenario names that its fault hit live traffic (a fault that hit nothing proves
nothing): {verdict(accepted)} in {passed} of {len(ran)}
scenarios run. What each scenario must show:

{_expects(ran)}

What each run's figures mean, and why it passed or failed:

{where}

Latency timelines, every request at the time it started (seconds from the first
fault), the faults and heals marked, the recovery window shaded:
{pictures}"""
    return text, [
        Target(
            "chaos: every scenario accepted (nothing lost or wrong, no unexplained "
            "error, no needless degraded answer, its fault shown to hit live traffic)",
            f"{passed} of {len(ran)} accepted; "
            + ", ".join(
                f"{sum(getattr(s, k) for s in ran):,} {k}"
                for k in ("lost", "wrong", "errors", "degraded")
            ),
            accepted if ran else None,
        )
    ]
