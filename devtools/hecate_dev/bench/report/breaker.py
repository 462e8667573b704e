"""The breaker section: how fast an OPEN reaches every router (``hecate bench breaker``)."""

# Prose for people: its dashes and multiplication signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from hecate_dev.bench.report.markdown import Doc, Target, num, provenance, table, verdict
from hecate_dev.bench.results import BreakerResult, load

BREAKER_TARGET_MS = 50.0  # an OPEN seen by every router
BREAKER_ANCHOR = "LiteLLM needs about 1 s"
REJECT_TARGET_US = 2000.0  # an open circuit rejects in well under 2 ms (spec §8)


def _ms(x: float | None) -> str:
    return "–" if x is None else num(x, 2)


def section_breaker(env: Doc, img: str) -> tuple[str, list[Target]]:
    del img  # no picture for this suite
    r = load(env["report"], BreakerResult)
    seen, meta = r.open_seen_ms, r.meta
    worst = seen.max
    complete = seen.samples == seen.expected
    met = worst is not None and complete and worst <= BREAKER_TARGET_MS
    met_reject = r.open_reject_us <= REJECT_TARGET_US
    figures = table(
        ["figure", "this run"],
        [
            ["OPEN seen by every watcher, p50 (ms)", _ms(seen.p50)],
            ["OPEN seen by every watcher, p99 (ms)", _ms(seen.p99)],
            ["OPEN seen by every watcher, max (ms)", _ms(worst)],
            ["samples seen / expected", f"{seen.samples:,} / {seen.expected:,}"],
            ["open-circuit rejection, `CircuitBreaker.allow()` (µs)", num(r.open_reject_us, 3)],
        ],
    )
    missing = "" if complete else f"; {seen.expected - seen.samples} OPENs never seen"
    text = f"""## Shared circuit breakers: how fast an OPEN reaches every router

{provenance(env)}
On one embedded nats-server: the breaker service in its own process, and
{meta.watchers} KV watchers on separate connections, each the path a router replica
follows (`BreakerView.follow`). Per trip ({meta.trips} trips) the bench publishes the
five failure reports that open a circuit and times, per watcher, the last report →
breaker service (KV get, state machine, compare-and-set write) → KV watch delivery.

{figures}

Target (issue: every router sees an OPEN within {num(BREAKER_TARGET_MS, 0)} ms of the
trip; {BREAKER_ANCHOR}): {verdict(met)}, the slowest of {seen.samples:,} samples
{"–" if worst is None else num(worst, 2)} ms{missing}. An open circuit rejects in
{num(r.open_reject_us, 3)} µs (spec: well under 2 ms): {verdict(met_reject)}.
"""
    return text, [
        Target(
            "breaker: every router sees an OPEN ≤ 50 ms",
            f"max {'–' if worst is None else num(worst, 2)} ms",
            met,
        )
    ]
