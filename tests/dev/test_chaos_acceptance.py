"""How a chaos run is counted and judged, from figures alone: a request is lost by what
happened on the wire, a degraded answer beside an intact pipeline fails the run, and so
does a fault that left no trace in live traffic."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from hecate.client.sdk import Attempt
from hecate_dev.chaos.acceptance import (
    Expect,
    answered_during,
    classify,
    degraded_while_intact,
    judge,
)
from hecate_dev.chaos.load import Record, Sample, failed_sends, summarize

TIMEOUT = Attempt(1, replied=False, code="client_timeout")
KILLED = Expect(("failover_events",), "the node killed had requests in flight")


def _sends(*replies: tuple[bool, str]) -> list[Attempt]:
    return [Attempt(i + 1, replied=r, code=c) for i, (r, c) in enumerate(replies)]


def test_sends_that_got_no_reply_are_lost_whatever_the_client_breaker_says() -> None:
    unanswered = _sends((False, "client_timeout"), (False, "client_timeout"))
    assert classify(False, False, unanswered, "client_breaker_open") == (
        "lost",
        "client_breaker_open",
    )
    # Refused by the breaker before anything went out: the swarm never said a word.
    assert classify(False, False, [], "client_breaker_open") == ("lost", "client_breaker_open")


def test_an_explicit_error_is_filed_under_the_swarm_s_own_code() -> None:
    refused = _sends((False, "client_timeout"), (True, "internal"))
    assert classify(False, False, refused, "client_breaker_open") == ("error", "internal")
    assert classify(False, False, _sends((True, "bad_request")), "bad_request") == (
        "error",
        "bad_request",
    )


def test_an_error_then_silence_is_lost() -> None:
    sends = _sends((True, "internal"), (False, "client_timeout"))
    assert classify(False, False, sends, "client_timeout") == ("lost", "client_timeout")


def test_an_answer_is_right_or_wrong() -> None:
    answered = _sends((False, "client_timeout"), (True, ""))
    assert classify(True, True, answered, "") == ("ok", "")
    assert classify(True, False, answered, "") == ("wrong", "")


@given(
    st.lists(st.tuples(st.booleans(), st.sampled_from(["", "internal", "client_timeout"]))),
    st.sampled_from(["client_timeout", "client_no_router", "client_breaker_open", "timeout"]),
)
def test_a_failed_call_is_lost_exactly_when_its_last_send_went_unanswered(
    replies: list[tuple[bool, str]], final: str
) -> None:
    sends = _sends(*replies)
    status, _code = classify(False, False, sends, final)
    assert (status == "lost") == (not sends or not sends[-1].replied)
    assert status in ("lost", "error")


PIPELINES: list[tuple[str, ...]] = [("a0", "a1", "a2"), ("b0", "b1", "b2")]


def test_a_degraded_answer_beside_an_intact_pipeline_is_counted() -> None:
    impaired = {"a1": 10.0}
    assert degraded_while_intact([11.0], PIPELINES, impaired) == 1  # b was intact
    assert degraded_while_intact([5.0], PIPELINES, impaired) == 1  # both were


def test_a_degraded_answer_with_every_pipeline_hurt_is_not() -> None:
    impaired = {"a1": 10.0, "b0": 12.0}
    assert degraded_while_intact([13.0, 11.0], PIPELINES, impaired) == 1  # only 11.0
    assert degraded_while_intact([], PIPELINES, impaired) == 0


def test_requests_answered_inside_each_outage_the_fewest_counts() -> None:
    spans = [(1.0, 1.1), (1.5, 1.6), (5.0, 5.1), (2.9, 3.2)]
    assert answered_during([(1.0, 2.0), (4.0, 6.0)], spans) == 1
    assert answered_during([(1.0, 2.0), (2.0, 3.0)], spans) == 0  # 2.9-3.2 ran past it
    assert answered_during([], spans) is None


def _figures(**extra: Any) -> dict[str, Any]:
    clean: dict[str, Any] = {
        "lost": 0,
        "wrong": 0,
        "errors": 0,
        "error_codes": {},
        "degraded_while_intact": 0,
        "checks": {"plan_survived": True},
        "evidence": {"failover_events": 3.0, "client_retries": 0.0, "recover_s": 0.0},
    }
    return {**clean, **extra}


def test_a_clean_run_with_its_evidence_is_accepted() -> None:
    verdicts = judge(_figures(), KILLED)
    assert all(verdicts.values()), verdicts
    assert "shows_failover_events" in verdicts


def test_every_criterion_can_fail() -> None:
    failing = {
        "nothing_lost": _figures(lost=1),
        "nothing_wrong": _figures(wrong=1),
        "no_error_but_the_allowed": _figures(errors=2, error_codes={"internal": 2}),
        "no_degraded_answer_beside_an_intact_pipeline": _figures(degraded_while_intact=1),
        "its_own_checks": _figures(checks={"plan_survived": False}),
        "shows_failover_events": _figures(evidence={"failover_events": 0.0}),
        "no_send_failed_but_the_allowed": _figures(send_failures={"client_timeout": 3}),
    }
    for criterion, figures in failing.items():
        verdicts = judge(figures, KILLED)
        assert [k for k, ok in verdicts.items() if not ok] == [criterion]


def test_only_the_errors_a_scenario_names_are_allowed() -> None:
    allows = Expect(("failover_events",), "x", allowed_errors={"no_plan": "no plan yet"})
    assert all(judge(_figures(errors=2, error_codes={"no_plan": 2}), allows).values())
    mixed = _figures(errors=3, error_codes={"no_plan": 2, "internal": 1})
    assert not judge(mixed, allows)["no_error_but_the_allowed"]


def test_a_failed_send_a_retry_hid_is_judged_too() -> None:
    """Every call answered, but three sends failed first: unless the scenario says why
    its fault makes that the right outcome, the run is not accepted."""
    hidden = _figures(send_failures={"client_timeout": 3})
    assert all(hidden.get(k, 0) == 0 for k in ("lost", "wrong", "errors"))
    assert not judge(hidden, KILLED)["no_send_failed_but_the_allowed"]
    allows = Expect(
        ("failover_events",),
        "x",
        allowed_send_failures={"client_timeout": "the only server is down for a second"},
    )
    assert judge(hidden, allows)["no_send_failed_but_the_allowed"]
    assert not judge(_figures(send_failures={"internal": 1}), allows)[
        "no_send_failed_but_the_allowed"
    ]


def test_the_failed_sends_of_a_call_leave_out_the_answer_and_the_moot_hedges() -> None:
    sends = [
        Attempt(1, replied=False, code="client_timeout"),
        Attempt(2, replied=True, code="rate_limited", hedge=False),
        Attempt(3, replied=False, code="client_superseded", hedge=True),
        Attempt(4, replied=True, code="", hedge=True),
    ]
    assert failed_sends(sends) == ("client_timeout", "rate_limited")
    assert failed_sends([Attempt(1, replied=False)]) == ("client_no_reply",)


def test_evidence_is_required_one_figure_at_a_time() -> None:
    both = Expect(("client_retries", "recover_s"), "callers time out and retry")
    figures = _figures(evidence={"client_retries": 4.0, "recover_s": 0.0})
    verdicts = judge(figures, both)
    assert (verdicts["shows_client_retries"], verdicts["shows_recover_s"]) == (True, False)


def test_a_result_saved_before_evidence_was_recorded_is_read_from_its_notes() -> None:
    old = _figures(notes={"failover_events": 2.0})
    del old["evidence"]
    assert judge(old, KILLED)["shows_failover_events"]


def test_the_line_of_figures_counts_what_happened_on_the_wire() -> None:
    record = Record(pipelines=PIPELINES)
    record.faults = [(10.0, "SIGKILL node a1")]
    record.impaired = {"a1": 10.0}
    record.failover_events = 2
    record.outages = [(10.0, 12.0)]
    record.samples = [Sample(i * 0.1, i * 0.1 + 0.005, "ok", nodes=("a1",)) for i in range(99)]
    record.samples += [
        Sample(10.1, 10.2, "ok", nodes=("x",), degraded=True),  # beside intact b
        Sample(10.2, 12.3, "ok", sends=2, failed_sends=("client_timeout",)),
        Sample(10.3, 14.4, "lost", "client_breaker_open", sends=2),
        Sample(11.0, 11.1, "error", "internal"),
        Sample(11.2, 11.21, "ok"),
    ]
    result = summarize("node-kill", record)
    assert (result["ok"], result["lost"], result["errors"]) == (102, 1, 1)
    assert result["lost_codes"] == {"client_breaker_open": 1}
    assert result["error_codes"] == {"internal": 1}
    assert result["send_failures"] == {"client_timeout": 1}  # the retried one counts
    assert (result["degraded"], result["degraded_while_intact"]) == (1, 1)
    assert result["evidence"]["failover_events"] == 2
    assert result["evidence"]["client_retries"] == 2  # one extra send each, twice
    assert result["evidence"]["answered_during_outages"] == 2
    assert result["evidence"]["recover_s"] == result["recover_s"] > 0
    verdicts = judge(result, KILLED)
    assert [k for k, ok in verdicts.items() if not ok] == [
        "nothing_lost",
        "no_error_but_the_allowed",
        "no_send_failed_but_the_allowed",
        "no_degraded_answer_beside_an_intact_pipeline",
    ]


def test_a_node_is_known_by_the_names_of_its_connections() -> None:
    from hecate_dev.chaos.faults import node_of_connection

    assert node_of_connection("hecate-node-a1-in") == "a1"
    assert node_of_connection("hecate-node-gpu-2-out") == "gpu-2"
    assert node_of_connection("hecate-router-r1-in") is None
    assert node_of_connection("hecate-node--in") is None
    assert node_of_connection("hecate-cli") is None
