"""The circuit breaker: every row of its transition table, driven by a fake clock."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hecate.resilience import TRANSITIONS, BreakerSnapshot, CircuitBreaker
from hecate.resilience.breaker import Event, State

STATES: frozenset[State] = frozenset({"closed", "open", "half_open"})


@dataclass
class Clock:
    """A fake monotonic clock: the breaker reads ``now``, the test moves it."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Recording(CircuitBreaker):
    """Records every row applied, self-loops included (``history`` keeps only changes)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.rows: list[tuple[State, Event]] = []
        super().__init__(*args, **kwargs)

    def _apply(self, event: Event, **changes: object) -> State:
        self.rows.append((self.snap.state, event))
        return super()._apply(event, **changes)

    @property
    def taken(self) -> set[tuple[State, Event]]:
        return set(self.rows)


def breaker(clock: Clock, snapshot: BreakerSnapshot | None = None, **config: Any) -> Recording:
    return Recording(clock=clock, snapshot=snapshot, **config)


def trip(b: CircuitBreaker, n: int = 5, hint: float | None = None) -> None:
    for _ in range(n - 1):
        b.record_failure()
    b.record_failure(hint)


# -- every row of the table ------------------------------------------------------------


def drive(row: tuple[State, Event], clock: Clock) -> Recording:
    """Put a fresh breaker through a short scenario that applies ``row``."""
    b = breaker(clock)
    match row:
        case ("closed", "success"):
            b.record_success()
        case ("closed", "failure"):
            b.record_failure()
        case ("closed", "trip"):
            trip(b)
        case ("open", "reject"):
            # an allow() that finds the probe expired re-opens, then rejects while open
            trip(b)
            clock.advance(60.0)
            assert b.allow()
            clock.advance(30.0)
            assert not b.allow()
        case ("open", "late"):
            trip(b)
            b.record_success()
        case ("open", "cooldown_over"):
            trip(b)
            clock.advance(60.0)
            assert b.state == "half_open"
        case ("half_open", "probe"):
            trip(b)
            clock.advance(60.0)
            assert b.allow()
        case ("half_open", "reject"):
            trip(b)
            clock.advance(60.0)
            assert b.allow()
            assert not b.allow()
        case ("half_open", "success"):
            trip(b)
            clock.advance(60.0)
            assert b.allow()
            b.record_success()
        case ("half_open", "failure"):
            trip(b)
            clock.advance(60.0)
            assert b.allow()
            b.record_failure()
        case ("half_open", "probe_expired"):
            trip(b)
            clock.advance(60.0)
            assert b.allow()
            clock.advance(30.0)
            assert b.state == "open"
        case ("half_open", "late"):
            trip(b)
            clock.advance(60.0)
            assert b.state == "half_open"
            b.record_failure()
        case ("open", "revived"):
            trip(b)
            clock.advance(1.0)
            assert b.revive()
        case _:
            pytest.fail(f"no scenario for the row {row}: add one")
    return b


@pytest.mark.parametrize("row", list(TRANSITIONS), ids=lambda r: f"{r[0]}-{r[1]}")
def test_every_row_of_the_transition_table_is_exercised(row: tuple[State, Event]) -> None:
    b = drive(row, Clock())
    assert row in b.taken
    assert b.snap.state == TRANSITIONS[row]


def test_the_table_has_exactly_the_rows_these_tests_know() -> None:
    assert set(TRANSITIONS) == {
        ("closed", "success"),
        ("closed", "failure"),
        ("closed", "trip"),
        ("open", "reject"),
        ("open", "late"),
        ("open", "cooldown_over"),
        ("open", "revived"),
        ("half_open", "probe"),
        ("half_open", "reject"),
        ("half_open", "late"),
        ("half_open", "success"),
        ("half_open", "failure"),
        ("half_open", "probe_expired"),
    }
    assert set(TRANSITIONS.values()) <= STATES


def test_the_history_records_each_state_change_in_order() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b)
    clock.advance(60.0)
    assert b.allow()
    b.record_failure()
    clock.advance(60.0)
    assert b.allow()
    b.record_success()
    assert b.history == [
        ("closed", "trip", "open"),
        ("open", "cooldown_over", "half_open"),
        ("half_open", "failure", "open"),
        ("open", "cooldown_over", "half_open"),
        ("half_open", "success", "closed"),
    ]


# -- a target known to be back --------------------------------------------------------


def test_a_revived_circuit_skips_its_cooldown_and_admits_exactly_one_probe() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b)
    clock.advance(1.0)
    assert not b.allow()
    assert b.revive()
    assert b.state == "half_open"
    assert b.retry_in() == 0.0
    assert b.allow()  # the probe
    assert not b.allow()
    b.record_success()
    assert b.state == "closed"


def test_a_revived_circuit_whose_probe_fails_opens_for_a_fresh_cooldown() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b)
    clock.advance(1.0)
    b.revive()
    assert b.allow()
    b.record_failure(code="internal")
    assert b.state == "open"
    assert b.retry_in() == 60.0
    assert b.snap.cause == "internal"


def test_a_failure_while_no_probe_is_out_does_not_restart_the_cooldown() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b)
    clock.advance(1.0)
    b.revive()
    b.record_failure(code="no reply within 2.0 s")  # sent to the node before it died
    assert b.state == "half_open"
    assert b.allow()  # the probe still decides


def test_revive_leaves_a_closed_circuit_and_a_probe_in_flight_alone() -> None:
    clock = Clock()
    b = breaker(clock)
    b.record_failure()
    assert not b.revive()
    assert b.snap.failures  # the streak is not forgiven: it is not the breaker's news
    trip(b)
    clock.advance(60.0)
    assert b.allow()  # the probe is out
    assert not b.revive()
    assert not b.allow()  # still only the one probe


def test_the_snapshot_keeps_the_cause_of_the_opening() -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(5):
        b.record_failure(code="no reply within 2.0 s")
    assert b.snap.cause == "no reply within 2.0 s"
    b.record_failure(code="internal")  # late, and asks for nothing longer
    assert b.snap.cause == "no reply within 2.0 s"
    b.record_failure(120.0, code="rate_limited")  # late, and holds it open longer
    assert b.snap.cause == "rate_limited"
    clock.advance(120.0)
    assert b.allow()
    clock.advance(30.0)  # the probe never reports
    assert b.state == "open"
    assert b.snap.cause == "probe expired"


# -- the seed's defaults ---------------------------------------------------------------


def test_the_defaults_are_the_seeds_five_failures_thirty_seconds_sixty_seconds() -> None:
    c = CircuitBreaker().config
    assert (c.failure_threshold, c.window_s, c.cooldown_s) == (5, 30.0, 60.0)


def test_five_consecutive_failures_within_thirty_seconds_open_the_circuit() -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(4):
        b.record_failure()
        clock.advance(7.0)
        assert b.state == "closed"
        assert b.allow()
    b.record_failure()  # 28 s after the first
    assert b.state == "open"
    assert not b.allow()
    assert ("closed", "trip") in b.taken


def test_an_open_circuit_rejects_for_sixty_seconds_then_admits_exactly_one_probe() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b)
    clock.advance(59.5)
    assert not b.allow()
    assert b.state == "open"
    clock.advance(0.5)
    assert b.allow()  # the probe
    assert b.state == "half_open"
    for _ in range(100):
        assert not b.allow()
    clock.advance(29.0)
    assert not b.allow()
    b.record_success()
    assert b.state == "closed"
    assert all(b.allow() for _ in range(10))


def test_a_success_between_failures_resets_the_streak() -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(4):
        b.record_failure()
    b.record_success()
    assert b.snap.failures == ()
    for _ in range(4):
        b.record_failure()
    assert b.state == "closed"  # the seed's breaker would have opened here
    b.record_failure()
    assert b.state == "open"


def test_failures_spread_over_more_than_the_window_do_not_trip() -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(20):
        b.record_failure()
        clock.advance(7.6)  # five failures span 30.4 s > 30 s
    assert b.state == "closed"
    assert len(b.snap.failures) == 4


def test_only_failures_within_the_window_count() -> None:
    clock = Clock()
    b = breaker(clock)
    b.record_failure()
    b.record_failure()
    clock.advance(31.0)  # those two leave the window
    for _ in range(4):
        b.record_failure()
    assert b.state == "closed"
    assert len(b.snap.failures) == 4
    b.record_failure()
    assert b.state == "open"


def test_a_failure_exactly_window_seconds_old_still_counts() -> None:
    clock = Clock()
    b = breaker(clock)
    b.record_failure()
    clock.advance(30.0)
    trip(b, 4)
    assert b.state == "open"


# -- hints hold the circuit open -------------------------------------------------------


def test_a_429_hint_longer_than_the_cooldown_keeps_the_circuit_open_that_long() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b, hint=120.0)
    assert b.retry_in() == 120.0
    clock.advance(119.0)
    assert not b.allow()
    clock.advance(1.0)
    assert b.allow()


def test_a_hint_shorter_than_the_cooldown_does_not_shorten_it() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b, hint=5.0)
    assert b.retry_in() == 60.0


@pytest.mark.parametrize("hint", [None, 0.0, -10.0, float("nan")], ids=str)
def test_a_missing_or_nonsense_hint_gives_the_plain_cooldown(hint: float | None) -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b, hint=hint)
    assert b.retry_in() == 60.0


@pytest.mark.parametrize("hint", [10_000.0, float("inf")], ids=str)
def test_a_hint_is_capped_by_max_open_s(hint: float) -> None:
    clock = Clock()
    b = breaker(clock, max_open_s=600.0)
    trip(b, hint=hint)
    assert b.retry_in() == 600.0
    clock.advance(600.0)
    assert b.allow()


def test_max_open_s_never_shortens_the_cooldown() -> None:
    clock = Clock()
    b = breaker(clock, cooldown_s=60.0, max_open_s=10.0)
    trip(b, hint=1000.0)
    assert b.retry_in() == 60.0


def test_a_late_failure_with_a_long_hint_while_open_extends_open_until() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b)
    clock.advance(10.0)
    b.record_failure(300.0)
    assert b.state == "open"
    assert b.snap.open_until == clock.now + 300.0
    assert b.retry_in() == 300.0
    assert ("open", "late") in b.taken
    clock.advance(299.0)
    assert not b.allow()
    clock.advance(1.0)
    assert b.allow()


def test_a_late_result_with_a_shorter_or_no_hint_never_shortens_open_until() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b, hint=200.0)
    until = b.snap.open_until
    b.record_failure(5.0)
    b.record_failure()
    b.record_success()
    assert b.snap.open_until == until
    assert b.snap.trips == 1


def test_a_late_hint_is_capped_by_max_open_s() -> None:
    clock = Clock()
    b = breaker(clock, max_open_s=600.0)
    trip(b)
    b.record_failure(1e9)
    assert b.snap.open_until == clock.now + 600.0


def test_a_late_success_while_open_does_not_close_the_circuit() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b)
    b.record_success()
    assert b.state == "open"
    assert not b.allow()


# -- the probe -------------------------------------------------------------------------


def test_a_probe_that_never_reports_expires_and_reopens_with_a_fresh_cooldown() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b)
    clock.advance(60.0)
    assert b.allow()
    clock.advance(29.5)
    assert b.state == "half_open"
    assert not b.allow()
    clock.advance(0.5)
    assert b.state == "open"  # HALF_OPEN cannot stick
    assert ("half_open", "probe_expired") in b.taken
    assert b.retry_in() == 60.0
    assert b.snap.trips == 2
    clock.advance(60.0)
    assert b.allow()  # a new probe
    assert not b.allow()


def test_an_expired_probe_is_noticed_by_allow_which_then_rejects() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b)
    clock.advance(60.0)
    assert b.allow()
    clock.advance(45.0)
    assert not b.allow()
    assert b.snap.state == "open"
    # The fresh cooldown runs from the moment the probe expired (probe start + 30 s),
    # not from when the expiry was noticed.
    assert b.snap.open_until == clock.now - 45.0 + 30.0 + 60.0


def test_the_probes_late_report_after_expiry_does_not_close_the_circuit() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b)
    clock.advance(60.0)
    assert b.allow()
    clock.advance(31.0)
    b.record_success()  # too late: the probe has already been written off
    assert b.state == "open"


def test_a_successful_probe_closes_the_circuit_and_resets_the_counters() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b)
    clock.advance(60.0)
    assert b.allow()
    b.record_success()
    assert b.state == "closed"
    assert b.snap.failures == ()
    assert b.snap.probe_started is None
    assert b.retry_in() == 0.0
    trip(b, 4)
    assert b.state == "closed"  # a full new streak is needed
    b.record_failure()
    assert b.state == "open"


def test_a_failed_probe_reopens_with_a_fresh_cooldown() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b)
    clock.advance(60.0)
    assert b.allow()
    clock.advance(5.0)
    b.record_failure()
    assert b.state == "open"
    assert b.snap.open_until == clock.now + 60.0
    assert b.snap.trips == 2
    clock.advance(59.0)
    assert not b.allow()
    clock.advance(1.0)
    assert b.allow()


def test_a_failed_probe_with_a_long_hint_reopens_for_the_hint() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b)
    clock.advance(60.0)
    assert b.allow()
    b.record_failure(90.0)
    assert b.retry_in() == 90.0


# -- retry_in --------------------------------------------------------------------------


def test_retry_in_counts_down_the_open_period() -> None:
    clock = Clock()
    b = breaker(clock)
    assert b.retry_in() == 0.0
    trip(b)
    assert b.retry_in() == 60.0
    clock.advance(15.0)
    assert b.retry_in() == 45.0
    clock.advance(45.0)
    assert b.retry_in() == 0.0
    assert b.allow()  # 0 means: the next allow() is admitted


def test_retry_in_is_not_zero_while_the_probe_is_out_and_allow_refuses() -> None:
    """retry_in() documents "0 when it would now"; with the probe out, it would not."""
    clock = Clock()
    b = breaker(clock)
    trip(b)
    clock.advance(60.0)
    assert b.allow()
    assert not b.allow()
    assert b.retry_in() > 0.0


# -- configuration ---------------------------------------------------------------------


def test_thresholds_are_configuration() -> None:
    clock = Clock()
    b = breaker(clock, failure_threshold=2, window_s=5.0, cooldown_s=10.0, probe_timeout_s=3.0)
    b.record_failure()
    clock.advance(6.0)
    b.record_failure()
    assert b.state == "closed"
    clock.advance(4.0)
    b.record_failure()
    assert b.state == "open"
    assert b.retry_in() == 10.0
    clock.advance(10.0)
    assert b.allow()
    clock.advance(3.0)
    assert b.state == "open"
    assert b.retry_in() == 10.0


def test_a_threshold_of_one_opens_on_the_first_failure() -> None:
    clock = Clock()
    b = breaker(clock, failure_threshold=1)
    b.record_failure()
    assert b.state == "open"


@pytest.mark.parametrize("threshold", [0, -1])
def test_a_threshold_below_one_is_refused(threshold: int) -> None:
    with pytest.raises(ValueError, match="failure_threshold"):
        CircuitBreaker(failure_threshold=threshold)


# -- snapshots -------------------------------------------------------------------------


def round_trip(snap: BreakerSnapshot) -> BreakerSnapshot:
    return msgspec.json.decode(msgspec.json.encode(snap), type=BreakerSnapshot)


def test_every_kind_of_snapshot_round_trips_through_msgspec_json() -> None:
    clock = Clock()
    b = breaker(clock)
    seen = [b.snap]
    b.record_failure()
    b.record_failure()
    seen.append(b.snap)
    trip(b, hint=77.5)
    seen.append(b.snap)
    clock.advance(77.5)
    assert b.allow()
    seen.append(b.snap)
    for snap in seen:
        assert round_trip(snap) == snap
    assert {s.state for s in seen} == STATES


def test_a_breaker_rebuilt_from_a_snapshot_behaves_the_same() -> None:
    clock = Clock()
    a = breaker(clock)
    trip(a, hint=90.0)
    clock.advance(90.0)
    assert a.allow()
    b = breaker(clock, snapshot=round_trip(a.snap))
    assert b.snap == a.snap
    assert not a.allow()
    assert not b.allow()  # the probe is out for the rebuilt one too
    clock.advance(30.0)
    assert a.state == b.state == "open"
    assert a.retry_in() == b.retry_in() == 60.0
    assert a.snap == b.snap


def test_a_rebuilt_breaker_keeps_the_failure_streak() -> None:
    clock = Clock()
    a = breaker(clock)
    trip(a, 4)
    b = CircuitBreaker(clock=clock, snapshot=round_trip(a.snap))
    b.record_failure()
    assert b.state == "open"


# -- random sequences ------------------------------------------------------------------

Op = tuple[Any, ...]  # ("advance", dt) | ("allow",) | ("failure", hint) | ...

hints = st.one_of(
    st.none(),
    st.floats(min_value=-10.0, max_value=500.0),
    st.sampled_from([0.0, 1e9, float("inf"), float("nan")]),
)
# weighted so that sequences trip, cool down and probe often (checked: most examples probe)
failures: st.SearchStrategy[Op] = st.tuples(st.just("failure"), hints)
allows: st.SearchStrategy[Op] = st.tuples(st.just("allow"))
ops: st.SearchStrategy[Op] = st.one_of(
    failures,
    failures,
    allows,
    allows,
    allows,
    allows,
    st.tuples(st.just("advance"), st.floats(min_value=0.0, max_value=10.0)),
    st.tuples(st.just("advance"), st.floats(min_value=0.0, max_value=120.0)),
    st.tuples(st.just("advance"), st.sampled_from([0.001, 1.0, 29.999, 30.0, 60.0])),
    st.tuples(st.just("success")),
    st.tuples(st.just("state")),
    st.tuples(st.just("retry_in")),
)
configs = st.fixed_dictionaries(
    {
        "failure_threshold": st.integers(min_value=1, max_value=5),
        "window_s": st.floats(min_value=0.0, max_value=60.0),
        "cooldown_s": st.floats(min_value=0.0, max_value=90.0),
        "probe_timeout_s": st.floats(min_value=0.001, max_value=60.0),
        "max_open_s": st.floats(min_value=0.0, max_value=300.0),
    }
)


def step(b: CircuitBreaker, clock: Clock, op: Op) -> object:
    match op:
        case ("advance", dt):
            clock.advance(dt)
            return None
        case ("allow",):
            return b.allow()
        case ("success",):
            b.record_success()
            return None
        case ("failure", hint):
            b.record_failure(hint)
            return None
        case ("state",):
            return b.state
        case ("retry_in",):
            return b.retry_in()
    raise AssertionError(op)


@settings(max_examples=300, deadline=None)
@given(config=configs, sequence=st.lists(ops, min_size=20, max_size=100))
def test_random_sequences_keep_the_breakers_invariants(
    config: dict[str, Any], sequence: list[Op]
) -> None:
    clock = Clock()
    b = breaker(clock, **config)
    timeout = config["probe_timeout_s"]
    longest_open = max(config["cooldown_s"], config["max_open_s"])
    probe_out_since: float | None = None  # a True allow() in half_open, not yet settled

    for op in sequence:
        before = b.snap
        open_and_cooling = before.state == "open" and clock.now < before.open_until
        result = step(b, clock, op)
        after = b.snap

        assert after.state in STATES
        if op[0] == "allow":
            if before.state == "closed":
                assert result is True
            if open_and_cooling:
                assert result is False
            if result is True and after.state == "half_open":
                assert probe_out_since is None or clock.now - probe_out_since >= timeout, (
                    "a second probe was admitted while the first was out"
                )
                probe_out_since = clock.now
        if after.state != "half_open" or op[0] in {"success", "failure"}:
            probe_out_since = None
        if after.state == "open":
            assert after.open_until - clock.now <= longest_open + 1e-9
        if after.state == "closed":
            assert len(after.failures) < config["failure_threshold"]
        if op[0] == "retry_in":
            # Open: until the cooldown ends; a probe out: until it reports or expires.
            assert isinstance(result, float)
            assert 0.0 <= result <= max(longest_open, timeout) + 1e-9
        if op[0] != "advance" and after.state == "half_open" and after.probe_started is not None:
            assert clock.now - after.probe_started < timeout, "a probe outlived its timeout"

    # advancing past the probe timeout never leaves a probe stranded
    if b.snap.state == "half_open" and b.snap.probe_started is not None:
        clock.advance(timeout + 1e-6)  # strictly past it (float sums round)
        assert b.state == "open" or b.allow()


silent_ops: st.SearchStrategy[Op] = st.one_of(
    allows,
    allows,
    st.tuples(st.just("advance"), st.floats(min_value=0.0, max_value=40.0)),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 10.0, 30.0, 60.0])),
    st.tuples(st.just("state")),
    st.tuples(st.just("retry_in")),
)


@settings(max_examples=300, deadline=None)
@given(
    timeout=st.floats(min_value=0.5, max_value=60.0),
    cooldown=st.floats(min_value=0.0, max_value=90.0),
    sequence=st.lists(silent_ops, min_size=10, max_size=100),
)
def test_probes_that_never_report_are_one_at_a_time_and_always_expire(
    timeout: float, cooldown: float, sequence: list[Op]
) -> None:
    clock = Clock()
    b = breaker(clock, cooldown_s=cooldown, probe_timeout_s=timeout)
    trip(b)
    admitted: list[float] = []
    for op in sequence:
        before = b.snap
        result = step(b, clock, op)
        if op[0] == "allow":
            if before.state == "open" and clock.now < before.open_until:
                assert result is False
            if result is True:
                assert b.snap.state == "half_open"
                admitted.append(clock.now)
        if op[0] != "advance":
            assert b.snap.state in {"open", "half_open"}  # nobody reported: never closed
            if b.snap.probe_started is not None:
                assert clock.now - b.snap.probe_started < timeout
    # successive probes are at least a probe timeout plus a cooldown apart
    for first, second in itertools.pairwise(admitted):
        assert second - first >= timeout + cooldown - 1e-9
    assert b.snap.trips == 1 + sum(1 for row in b.rows if row == ("half_open", "probe_expired"))


@settings(max_examples=200, deadline=None)
@given(
    config=configs,
    before=st.lists(ops, min_size=5, max_size=50),
    after=st.lists(ops, min_size=5, max_size=50),
)
def test_a_breaker_rebuilt_from_its_json_snapshot_answers_identically(
    config: dict[str, Any], before: list[Op], after: list[Op]
) -> None:
    clock = Clock()
    a = breaker(clock, **config)
    for op in before:
        step(a, clock, op)
    b = breaker(clock, snapshot=round_trip(a.snap), **config)
    for op in after:
        if op[0] == "advance":
            clock.advance(op[1])
            continue
        assert step(a, clock, op) == step(b, clock, op)
        assert a.snap == b.snap
