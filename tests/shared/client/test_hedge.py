"""The hedging policy (client/hedge.py), pure: when a silent send is sent again."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hecate.client.hedge import FLOOR_S, Hedge, LatencyEstimate, cap_of

estimates = st.none() | st.floats(min_value=0, max_value=1e4, allow_nan=False)
timeouts = st.floats(min_value=0.01, max_value=600, allow_nan=False)
# What happens to a call, step by step: time passes, a token arrives, a send is gone.
steps = st.lists(
    st.tuples(
        st.sampled_from(["wait", "token", "gone"]),
        st.floats(min_value=0, max_value=5, allow_nan=False),
    ),
    max_size=60,
)


@given(estimates, timeouts)
def test_the_delay_stays_between_the_floor_and_the_cap(estimate: float | None, t: float) -> None:
    hedge = Hedge(estimate, cap_of(t))
    assert FLOOR_S <= hedge.delay_s() <= max(FLOOR_S, t / 2)


@given(st.floats(min_value=0, max_value=10, allow_nan=False), timeouts)
def test_a_slower_swarm_waits_longer_before_hedging(estimate: float, t: float) -> None:
    assert Hedge(estimate, cap_of(t)).delay_s() <= Hedge(estimate * 2, cap_of(t)).delay_s()


def test_a_client_that_never_saw_an_answer_waits_the_cap() -> None:
    assert Hedge(None, cap_of(2.0)).delay_s() == 1.0
    assert Hedge(0.02, cap_of(2.0)).delay_s() == FLOOR_S  # a fast swarm: the floor


@given(estimates, timeouts, st.integers(min_value=1, max_value=5), steps)
def test_never_more_sends_in_flight_than_allowed_and_never_early(
    estimate: float | None, t: float, most: int, events: list[tuple[str, float]]
) -> None:
    """Drive a call as the client does: a hedge whenever one is due. At no point are
    more than ``most`` sends outstanding, and each hedge follows a full delay of
    silence (no send, no token)."""
    hedge = Hedge(estimate, cap_of(t), max_outstanding=most)
    now, quiet_since = 0.0, 0.0
    hedge.sent(now)
    for what, dt in events:
        now += dt
        if what == "token":
            hedge.heard(now)
            quiet_since = now
        elif what == "gone":
            hedge.gone()
        if hedge.should_hedge(now):
            assert now - quiet_since >= hedge.delay_s()
            hedge.hedged(now)
            quiet_since = now
        assert hedge.outstanding <= most


@given(estimates, st.floats(min_value=0.01, max_value=1e3, allow_nan=False))
def test_no_hedge_while_tokens_flow(estimate: float | None, t: float) -> None:
    """Tokens closer together than the delay keep a stream from ever being hedged,
    however long it runs."""
    hedge = Hedge(estimate, cap_of(t))
    gap = hedge.delay_s() * 0.99
    now = 0.0
    hedge.sent(now)
    for _ in range(200):
        now += gap
        assert not hedge.should_hedge(now)
        hedge.heard(now)
    assert hedge.hedges == 0


def test_silence_is_hedged_up_to_the_bound_then_no_more() -> None:
    hedge = Hedge(0.01, cap_of(2.0), max_outstanding=3)
    hedge.sent(0.0)
    assert not hedge.should_hedge(FLOOR_S - 0.01)
    assert hedge.should_hedge(FLOOR_S)
    hedge.hedged(FLOOR_S)
    assert hedge.due_at() == 2 * FLOOR_S
    hedge.hedged(2 * FLOOR_S)
    assert hedge.due_at() is None  # three out: the rest of the timeout is waited out
    assert hedge.hedges == 2
    hedge.gone()  # one met no responders: room for another
    assert hedge.due_at() == 3 * FLOOR_S


def test_a_single_send_policy_never_hedges() -> None:
    hedge = Hedge(0.01, cap_of(2.0), max_outstanding=1)
    hedge.sent(0.0)
    assert hedge.due_at() is None


@given(st.lists(st.floats(min_value=0, max_value=100, allow_nan=False), min_size=1))
def test_the_estimate_stays_within_what_was_seen(latencies: list[float]) -> None:
    estimate = LatencyEstimate()
    for x in latencies:
        estimate.observe(x)
    assert estimate.mean_s is not None
    assert min(latencies) - 1e-9 <= estimate.mean_s <= max(latencies) + 1e-9
