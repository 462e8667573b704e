"""The held-caller herd (``hecate-queue``) is simulated, not assumed: a caller whose slot
lies beyond its ``max_wait_ms`` is refused and sends again, so the figure can fail."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hecate_dev.bench.herd import simulate, simulate_held


def test_callers_that_wait_long_enough_send_once() -> None:
    held = simulate_held(max_wait_ms=10_000)
    assert held["attempts_per_success"] == 1.0
    assert (held["held"], held["refused"], held["successes"]) == (900, 0, 1000)
    assert held["last_success_s"] == 9.0  # the 1,000th slot at 100/s after a burst of 100


def test_holds_that_expire_cost_a_second_send_and_fail_the_target() -> None:
    short = simulate_held(max_wait_ms=5_000)
    assert short["attempts_per_success"] > 1.05
    # Slots beyond 5 s (the last 400 of the 900 waiting) are refused, each once.
    assert short["refused"] == 400
    assert short["attempts_per_success"] == 1.4
    assert short["successes"] == 1000


def test_without_any_wait_holding_is_refusing() -> None:
    never = simulate_held(max_wait_ms=0)
    assert never["attempts_per_success"] == simulate("hecate")["attempts_per_success"] == 1.9


def test_a_caller_out_of_attempts_is_not_served() -> None:
    # One attempt allowed and no wait: every caller that must wait is refused for good.
    out = simulate_held(max_wait_ms=0, attempts_allowed=1)
    assert out["successes"] == 100
    assert out["gave_up"] == 900


def test_the_named_policies_use_their_callers_wait() -> None:
    assert simulate("hecate-queue") == simulate_held(max_wait_ms=10_000)
    assert simulate("hecate-queue-5s")["attempts_per_success"] > 1.05


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 12_000), st.integers(50, 400))
def test_every_send_is_a_first_send_or_a_refusal_retried(wait_ms: int, clients: int) -> None:
    out = simulate_held(max_wait_ms=wait_ms, clients=clients)
    assert out["successes"] == clients
    assert out["attempts_per_success"] == round((clients + out["refused"]) / clients, 3)
    assert out["attempts_per_success"] >= 1.0
