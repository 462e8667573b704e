"""How a chaos scenario is judged: what each request's fate was, and whether the run
proves what the scenario claims. Pure functions over figures; no processes, no bus.

A request's fate is read off the wire, not off the client's last word:

* ``ok`` / ``wrong``: an answer came back (checked against the reference);
* ``error``: the swarm's last word was an explicit error reply;
* ``lost``: its last send got no reply at all, or nothing was sent. The client's own
  breaker refusing to try again (``client_breaker_open``) does not turn silence into an
  error: the swarm never said anything.

Every send is judged too, not only each call's last: a send that failed and was retried
(its error, or the client's timeout for its silence) is a failure the caller's retry
hid. A scenario passes only if nothing was lost or wrong, no error came back, and no
send failed, except with the codes its fault makes the right answer (each named with
its reason: ``allowed_errors`` for an answer, ``allowed_send_failures`` for a send a
retry then made good), no answer came from
the reserve model while an intact pipeline of the base model was up, its own checks
hold, and its fault demonstrably hit live traffic (:class:`Expect` names the evidence).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from hecate.client.sdk import Attempt

Status = Literal["ok", "wrong", "error", "lost"]

Evidence = Literal[
    "failover_events", "client_retries", "recover_s", "answered_during_outages", "slowed_answers"
]
"""Figures that prove a fault hit requests in flight: router failovers, sends the callers
had to repeat, time until the service looked normal again, (for a part that is not
on the request path) the fewest requests answered from start to end within one outage,
and (for a link made slow, not broken) the answers that crossed it while slow and took
at least the round trip it added."""


def classify(
    answered: bool, right: bool, sends: Sequence[Attempt], final_code: str
) -> tuple[Status, str]:
    """The fate of one request and the code to file it under.

    ``answered``/``right``: the call returned an answer, and it equals the reference.
    ``sends``: every send in order, as the client reported it. ``final_code``: the
    code of the error the call returned; a ``lost`` request is filed under it (the
    client's timeout, no router, or its breaker), an ``error`` under the swarm's own
    last code."""
    if answered:
        return ("ok" if right else "wrong"), ""
    if sends and sends[-1].replied:
        return "error", sends[-1].code or final_code
    return "lost", final_code


def degraded_while_intact(
    degraded_ends: Iterable[float],
    pipelines: Sequence[Sequence[str]],
    impaired: Mapping[str, float],
) -> int:
    """How many degraded answers (given by when each ended) came while some pipeline of
    the base model had none of its nodes impaired by the scenario (``impaired``: node ->
    when the scenario first hurt it; a node stays impaired to the end of the run).

    Unknown pipelines (an empty list) mean nothing can be claimed: every degraded
    answer counts, which is what a scenario that breaks no node wants."""
    count = 0
    for end in degraded_ends:
        intact = not pipelines or any(
            all(impaired.get(node, float("inf")) > end for node in p) for p in pipelines
        )
        count += intact
    return count


def answered_during(
    outages: Sequence[tuple[float, float]], spans: Iterable[tuple[float, float]]
) -> int | None:
    """The fewest answered requests that both started and ended within one outage
    (``spans``: (started, ended) of every right answer); None without outages."""
    if not outages:
        return None
    answered = list(spans)
    return min(sum(1 for s, e in answered if lo <= s and e <= hi) for lo, hi in outages)


@dataclass(frozen=True)
class Expect:
    """What a scenario's run must show. ``evidence``: every figure named must be above
    zero, and ``because`` says why the fault cannot miss them. ``allowed_errors``: the
    error codes the fault makes the right answer, each with its reason; any other
    explicit error fails the run."""

    evidence: tuple[Evidence, ...]
    because: str
    allowed_errors: Mapping[str, str] = field(default_factory=dict)
    # Codes a send may fail with, retried by its caller, because of the fault.
    allowed_send_failures: Mapping[str, str] = field(default_factory=dict)

    def doc(self) -> dict[str, Any]:
        return {
            "evidence": list(self.evidence),
            "because": self.because,
            "allowed_errors": dict(self.allowed_errors),
            "allowed_send_failures": dict(self.allowed_send_failures),
        }

    def allows_send(self, code: str) -> bool:
        return code in self.allowed_errors or code in self.allowed_send_failures


def evidence_of(figures: Mapping[str, Any]) -> dict[str, float]:
    """The evidence figures of a saved scenario (older results kept the failover count
    among their notes)."""
    saved: dict[str, float] = dict(figures.get("evidence") or {})
    notes = figures.get("notes") or {}
    if "failover_events" not in saved and "failover_events" in notes:
        saved["failover_events"] = float(notes["failover_events"])
    if "recover_s" not in saved and "recover_s" in figures:
        saved["recover_s"] = float(figures["recover_s"])
    return saved


def judge(figures: Mapping[str, Any], expect: Expect) -> dict[str, bool]:
    """Every criterion of acceptance, by name (the run passes iff all are true)."""
    codes: Mapping[str, int] = figures.get("error_codes") or {}
    allowed = sum(n for code, n in codes.items() if code in expect.allowed_errors)
    failed_sends: Mapping[str, int] = figures.get("send_failures") or {}
    verdict = {
        "nothing_lost": figures.get("lost", 0) == 0,
        "nothing_wrong": figures.get("wrong", 0) == 0,
        "no_error_but_the_allowed": figures.get("errors", 0) == allowed,
        "no_send_failed_but_the_allowed": all(expect.allows_send(c) for c in failed_sends),
        "no_degraded_answer_beside_an_intact_pipeline": (
            figures.get("degraded_while_intact", 0) == 0
        ),
        "its_own_checks": all((figures.get("checks") or {}).values()),
    }
    seen = evidence_of(figures)
    for name in expect.evidence:
        verdict[f"shows_{name}"] = (seen.get(name) or 0) > 0
    return verdict
