"""The herd section: retry policies against a rate limit (``hecate bench herd``)."""

# Prose for people: its dashes and multiplication signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from hecate_dev.bench.report.markdown import Doc, Target, num, provenance, table, verdict
from hecate_dev.bench.results import HerdResult, load

HERD_TARGET_HECATE = 1.95  # attempts per success, refused callers
HERD_TARGET_QUEUE = 1.05  # attempts per success, held callers
HERD_ANCHOR_EXACT = 5.5  # published: retrying at exactly Retry-After
HERD_ANCHOR_JITTER = (4.0, 4.4)  # published: jitter on top of the hint

HERD_ROWS = {
    "exact": "`exact` (retry at exactly Retry-After)",
    "seed": "`seed` (Retry-After + U(0.1, 0.5) s)",
    "full": "`full` (Retry-After + full jitter)",
    "decorrelated": "`decorrelated` (Retry-After + decorrelated jitter)",
    "hecate": "`hecate` (slot-assigned Retry-After + ticket)",
    "hecate-queue": "`hecate-queue` (held until its slot, callers' max wait {wait})",
    "hecate-queue-5s": "`hecate-queue`, callers' max wait {wait}: later slots refused",
}


def section_herd(env: Doc, img: str) -> tuple[str, list[Target]]:
    r = load(env["report"], HerdResult)
    meta, pol = r.meta, r.policies
    ideal = r.ideal_last_success_s
    floor = 1 + (meta.clients - meta.burst) / meta.clients
    bold = {"hecate", "hecate-queue"}
    waits = meta.queue_max_wait_ms
    rows = []
    for name, label in HERD_ROWS.items():
        if name in pol:
            a, t = num(pol[name].attempts_per_success, 2), num(pol[name].last_success_s, 2)
            wait = waits.get(name)
            label = label.format(wait="–" if wait is None else f"{num(wait / 1000, 0)} s")
            rows.append([label, f"**{a}**", f"**{t}**"] if name in bold else [label, a, t])
    rows.append(["ideal", f"1.00 (held) / {num(floor, 2)} (refused once)", num(ideal, 2)])
    policies = table(["policy", "attempts per success", "last success (s)"], rows)

    def attempts(name: str) -> float:
        return pol[name].attempts_per_success

    def last(name: str) -> float:
        return pol[name].last_success_s

    exact_ok = abs(attempts("exact") - HERD_ANCHOR_EXACT) <= 0.25
    lo, hi = HERD_ANCHOR_JITTER
    seed_ok = lo - 0.1 <= attempts("seed") <= hi + 0.1
    anchors = "reproduces" if exact_ok and seed_ok else "**does not reproduce**"
    met_hecate = attempts("hecate") <= HERD_TARGET_HECATE and last("hecate") <= 1.1 * ideal
    queue = pol["hecate-queue"]
    served = meta.clients if queue.successes is None else queue.successes
    # Held callers are simulated (hold, slot, refusal past max_wait, the SDK's retry), so
    # this can fail: a wait shorter than the herd's, or a hold that misses its slot.
    met_queue = attempts("hecate-queue") <= HERD_TARGET_QUEUE and served == meta.clients
    short = ""
    if "hecate-queue-5s" in pol:
        s5 = pol["hecate-queue-5s"]
        short = (
            f" With callers that wait at most {num(waits.get('hecate-queue-5s', 0) / 1000, 0)} s,"
            f" the {num(s5.refused or 0, 0)} whose slot is later are refused with their"
            f" ticket and come back (the SDK's Retry-After + U(0.1, 0.5) s): "
            f"{num(attempts('hecate-queue-5s'), 2)} attempts per success."
        )
    text = f"""## A thundering herd against a rate limit (simulated)

{provenance(env)}
A deterministic discrete-event simulation: no sleeping, no network; jittered policies
averaged over {meta.seeds} seeds. {meta.clients:,} clients send at t = 0 to an
upstream admitting {num(meta.rate_per_s, 0)} requests/s with a burst of
{num(meta.burst, 0)}, so {meta.clients - meta.burst:,.0f} must wait. Upstream
refusals carry an integer Retry-After (HTTP delay-seconds, rounded up), except for
`hecate`, whose quota books each refused caller its own slot and returns the exact wait
with a ticket.

{policies}

The simulation {anchors} the published anchors: exact Retry-After
{num(HERD_ANCHOR_EXACT, 1)}× (here {num(attempts("exact"), 2)}), jitter on top of the
hint {num(lo, 1)}–{num(hi, 1)}× (here `seed` {num(attempts("seed"), 2)}). Jitter alone
cannot fix a herd: spreading retries trades attempts for time (full and decorrelated
jitter take {num(attempts("full"), 2)} and {num(attempts("decorrelated"), 2)} attempts per
success but finish at {num(last("full"), 1)} and {num(last("decorrelated"), 1)} s, against
{num(last("exact"), 1)} s for exact). Only shared admission that tells each caller its
own turn gets to the floor: `hecate` refuses each waiting caller at most once and
serves the last one at {num(last("hecate"), 2)} s (ideal {num(ideal, 2)} s); holding the
request instead of refusing it (`hecate-queue`) sends each request once when the
caller's `max_wait_ms` covers its slot: the router holds it, wakes it on its 20 ms sweep
at the slot and asks the desk again with the ticket ({num(attempts("hecate-queue"), 2)}
attempts per success, {served:,} of {meta.clients:,} served, callers waiting at most
{num(waits.get("hecate-queue", 0) / 1000, 0)} s).{short}

Targets: `hecate` ≤ {HERD_TARGET_HECATE} attempts per success, last success within 10 %
of the ideal: {verdict(met_hecate)}; `hecate-queue` ≤ {HERD_TARGET_QUEUE}:
{verdict(met_queue)}.

![attempts per success and last success per retry policy]({img}/bench-herd.png)
"""
    return text, [
        Target(
            "herd (simulated): `hecate` ≤ 1.95 attempts per success, last success ≤ 1.1× ideal",
            f"{num(attempts('hecate'), 2)} attempts, {num(last('hecate'), 2)} s",
            met_hecate,
        ),
        Target(
            "herd (simulated): `hecate-queue` ≤ 1.05 attempts per success",
            f"{num(attempts('hecate-queue'), 2)} attempts",
            met_queue,
        ),
    ]
