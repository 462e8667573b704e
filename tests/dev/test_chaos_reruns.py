"""``hecate chaos`` runs a scenario again when its fault hit no live traffic (its
evidence its only shortfall), at most three runs in all, and says how many missed; a
run that lost, erred or answered wrong is never run again."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hecate_dev.chaos.cli import RUNS_TO_BITE, run_until_it_bites
from hecate_dev.chaos.results import ScenarioResult

ACCEPTED = {"nothing_lost": True, "nothing_wrong": True, "shows_failover_events": True}
MISSED = {**ACCEPTED, "shows_failover_events": False}
LOST = {**MISSED, "nothing_lost": False}


def _result(acceptance: dict[str, bool], run: int) -> ScenarioResult:
    return ScenarioResult(
        scenario="llm-kill",
        sent=run,  # which run this was
        ok=run,
        errors=0,
        lost=0,
        wrong=0,
        p99_ms=1.0,
        max_ms=1.0,
        recover_s=0.0,
        acceptance=acceptance,
    )


def _runs(*outcomes: dict[str, bool]) -> tuple[ScenarioResult, int]:
    """The result of run_until_it_bites over these outcomes, and how many it ran."""
    ran = 0

    def run() -> ScenarioResult:
        nonlocal ran
        ran += 1
        return _result(outcomes[ran - 1], ran)

    return run_until_it_bites(run), ran


def test_a_run_that_missed_its_traffic_is_run_again_until_one_bites() -> None:
    result, ran = _runs(MISSED, ACCEPTED)
    assert (ran, result.sent, result.missed, result.accepted) == (2, 2, 1, True)


def test_at_most_three_runs_and_the_last_one_is_reported_as_missed() -> None:
    result, ran = _runs(MISSED, MISSED, MISSED, ACCEPTED)
    assert ran == RUNS_TO_BITE == 3
    assert (result.sent, result.missed, result.accepted) == (3, 2, False)


def test_a_run_that_lost_a_request_is_never_run_again() -> None:
    result, ran = _runs(LOST, ACCEPTED)
    assert (ran, result.missed, result.accepted) == (1, 0, False)
    assert not result.missed_its_traffic


@given(st.lists(st.sampled_from(["accepted", "missed", "lost"]), min_size=3, max_size=3))
def test_it_stops_at_the_first_run_that_proves_something(kinds: list[str]) -> None:
    table = {"accepted": ACCEPTED, "missed": MISSED, "lost": LOST}
    result, ran = _runs(*(table[k] for k in kinds))
    first = next((i for i, k in enumerate(kinds) if k != "missed"), len(kinds) - 1)
    assert ran == first + 1
    assert result.missed == first
    assert result.accepted is (kinds[first] == "accepted")
