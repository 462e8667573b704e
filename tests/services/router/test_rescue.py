"""The rescue decision alone: every failure kind, the reconnect window, the limits."""

from __future__ import annotations

from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate.core import Recovered, Route, Unrecoverable
from hecate.core.plan import Stage
from hecate.wire.messages import ErrorBody
from hecate_router.flow import REQUEST_FAULTS, Failure, FailureKind, FlowOptions
from hecate_router.reconnect import ReconnectWindow
from hecate_router.rescue import GiveUp, ResendSoon, classify, triage, verdict

OPTS = FlowOptions(max_attempts=3, max_replays=2, reconnect_grace_s=3.0, resend_delay_s=0.1)
ROUTE = Route(
    model_id="m",
    pipeline_id="p",
    cost=1.0,
    stages=(Stage(node_id="b", layer_start=0, layer_end=4),),
)
RESCUED = Recovered(kind="replica", degraded=False, replaced=(), route=ROUTE)
KINDS: tuple[FailureKind, ...] = get_args(FailureKind)


@given(
    kind=st.sampled_from(KINDS),
    since=st.floats(0, 10),
    stage=st.integers(0, 3),
    chain=st.booleans(),
)
def test_triage_resends_only_no_responders_just_after_a_reconnect(
    kind: FailureKind, since: float, stage: int, chain: bool
) -> None:
    opts = FlowOptions(chain=chain, reconnect_grace_s=3.0, resend_delay_s=0.1)
    now = 100.0
    window = ReconnectWindow()
    window.reconnected(now - since, expected=["a", "b"])  # nothing heard since
    why = Failure(kind, "why")
    got = triage(why, now, node_id="b", window=window, stage=stage, opts=opts)
    if kind == "too_large":
        assert got == GiveUp("payload_too_large", "why")  # the request's size, not a node
    elif kind == "unsendable":
        assert got == GiveUp("bad_request", "why")  # the request's data, not a node
    elif kind == "no_responders" and since < 3.0 and (not chain or stage == 0):
        assert got == ResendSoon(now + 0.1)
    else:
        assert got is None


@given(since=st.floats(0, 2.9), chain=st.booleans())
def test_triage_blames_at_once_a_node_that_answered_since_the_reconnect(
    since: float, chain: bool
) -> None:
    opts = FlowOptions(chain=chain, reconnect_grace_s=3.0, resend_delay_s=0.1)
    now = 100.0
    window = ReconnectWindow()
    window.reconnected(now - since, expected=["a", "b"])
    window.replied("b", now - since)  # its subscriptions were back: now it is gone
    why = Failure("no_responders", "no responders")
    assert triage(why, now, node_id="b", window=window, stage=0, opts=opts) is None
    # The rest of the swarm was back at once: "a" is given the floor, not the cap.
    got = triage(why, now, node_id="a", window=window, stage=0, opts=opts)
    assert got == (ResendSoon(now + 0.1) if since < window.floor_s else None)


@given(attempts=st.integers(1, 5), replays=st.none() | st.integers(0, 4))
def test_verdict_moves_until_a_limit_and_names_the_last_loss(
    attempts: int, replays: int | None
) -> None:
    got = verdict(
        RESCUED, Failure("timeout", "slow"), "a", attempts=attempts, replays=replays, opts=OPTS
    )
    if replays is not None and replays >= 2:
        assert isinstance(got, GiveUp)
        assert got.code == "unrecoverable"
        assert "migration limit" in got.message
        assert "a (slow)" in got.message
    elif attempts >= 3:
        assert isinstance(got, GiveUp)
        assert got.code == "unrecoverable"
        assert f"after {attempts} attempts" in got.message
    else:
        assert got is RESCUED


def test_no_rescue_passes_on_the_upstreams_retry_hint_else_says_unrecoverable() -> None:
    lost = Unrecoverable("no replica, no splice", model_id="m", lost_node="a")
    limited = Failure("error_reply", "rate_limited: slow down", "rate_limited", 2.5)
    assert verdict(lost, limited, "a", attempts=1, replays=None, opts=OPTS) == GiveUp(
        "rate_limited", "rate_limited: slow down", 2.5
    )
    plain = verdict(lost, Failure("timeout", "slow"), "a", attempts=1, replays=None, opts=OPTS)
    assert isinstance(plain, GiveUp)
    assert plain.code == "unrecoverable"


@pytest.mark.parametrize(
    "code", sorted(REQUEST_FAULTS | {"no_responders", "overloaded", "internal"})
)
def test_an_error_reply_is_the_requests_fault_or_a_node_failure(code: str) -> None:
    got = classify(ErrorBody(code=code, message="m", retry_after_s=1.0))
    if code in REQUEST_FAULTS:
        assert got == GiveUp(code, "m")  # type: ignore[arg-type]
    elif code == "no_responders":  # relayed by the node that chained to the missing one
        assert isinstance(got, Failure)
        assert got.kind == "no_responders"
        assert got.silent
    else:
        assert got == Failure("error_reply", f"{code}: m", code, 1.0)
        assert got.breaker_code == code
