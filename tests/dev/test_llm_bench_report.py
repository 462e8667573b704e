"""Many users at once (``hecate bench llm --concurrency``): the figures of a level come
from what each user saw, and the targets are judged from those figures, so bad figures
fail them. Pure: generations in, figures, verdicts and report text out."""

# The report is typographic prose; the tests quote it exactly.
# ruff: noqa: RUF001

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate_dev.bench.concurrency import (
    PROMPTS,
    Generation,
    against_one_process,
    deadline_s,
    failed_checks,
    level_figures,
    order,
    over_rounds,
    parse_levels,
    percentile,
    prompts_for,
    verdicts,
)
from hecate_dev.bench.report import figures, pictures, render
from tests.dev.bench_results import results


def _users(n: int, *, seconds: float, ttft: float, tokens: int = 32) -> list[Generation]:
    """``n`` users sent at 0, each answered after ``seconds`` with its first token
    after ``ttft`` (user i a little later than user i-1)."""
    return [
        Generation(sent=0.0, replied=seconds + i * 0.01, first_token=ttft + i * 0.01, tokens=tokens)
        for i in range(n)
    ]


def _round(speed: dict[int, tuple[float, float]], tokens: int = 32) -> dict[str, Any]:
    """A round in which level n's users all took ``speed[n] = (seconds, ttft)``."""
    return {
        "levels": {
            str(n): level_figures(_users(n, seconds=s, ttft=t, tokens=tokens))
            for n, (s, t) in speed.items()
        }
    }


# 1 user: 32 tokens in 2 s (16 tokens/s), first after 0.5 s.
GOOD = {1: (2.0, 0.5), 2: (2.0, 0.6), 4: (2.1, 0.7), 8: (3.5, 1.0), 16: (7.0, 1.4)}
TODAY = {1: (2.0, 0.5), 2: (5.5, 0.8), 4: (10.0, 1.6), 8: (30.0, 2.2), 16: (60.0, 4.0)}


def test_a_level_counts_tokens_over_the_wall_time_from_first_send_to_last_reply() -> None:
    gens = [
        Generation(sent=10.0, replied=14.0, first_token=10.5, tokens=40),
        Generation(sent=10.1, replied=12.1, first_token=10.4, tokens=40, sends=2),
        Generation(sent=10.2, replied=11.0, first_token=None, tokens=0, code="rate_limited"),
        Generation(sent=10.3, replied=None, first_token=10.9, tokens=3),  # lost
    ]
    f = level_figures(gens)
    assert (f["sent"], f["answered"], f["errors"], f["lost"], f["wrong"]) == (4, 2, 1, 1, 0)
    assert f["errors_by_code"] == {"rate_limited": 1}
    assert f["resent"] == 1  # refused once, answered on its second send
    assert f["tokens"] == 80  # the answered users' tokens only
    assert f["aggregate_tokens_per_s"] == 20.0  # 80 tokens from 10.0 to 14.0
    assert f["per_user_tokens_per_s"] == 15.0  # median of 10 and 20
    # TTFT over every user that saw a first token, the lost one included
    assert f["ttft_p50_ms"] == 500.0
    assert f["ttft_p99_ms"] == pytest.approx(598.0, abs=0.1)  # 300, 500, 600


def test_a_wrong_text_is_counted_apart_and_named() -> None:
    gens = [*_users(3, seconds=2.0, ttft=0.5), Generation(0.0, 2.0, 0.5, 32, text_ok=False)]
    rounds = [{"levels": {"4": level_figures(gens)}}]
    assert level_figures(gens)["wrong"] == 1
    assert failed_checks(rounds) == ["concurrency 4 (round 1): 1 of 4 texts wrong"]
    assert verdicts(rounds)["texts_right"] == {"met": False, "wrong": 1}


def test_nothing_answered_gives_no_speed_and_no_ttft() -> None:
    f = level_figures([Generation(sent=0.0, replied=None, first_token=None, tokens=0)] * 2)
    assert (f["lost"], f["aggregate_tokens_per_s"], f["per_user_tokens_per_s"]) == (2, 0.0, 0.0)
    assert f["ttft_p50_ms"] is None


def test_good_figures_meet_every_target() -> None:
    v = verdicts([_round(GOOD), _round(GOOD)])
    assert v["all_answered"]["met"] is True
    assert v["texts_right"]["met"] is True
    # 8 users: 256 tokens in 3.57 s against 16 tokens/s alone
    assert v["speedup"]["met"] is True
    assert v["speedup"]["median"] == pytest.approx(4.48, abs=0.01)
    assert v["ttft"]["met"] is True  # p99 1.07 s against 0.5 s alone


def test_the_issue_s_figures_fail_the_speed_and_ttft_targets() -> None:
    v = verdicts([_round(TODAY)])
    assert v["speedup"]["met"] is False
    assert v["speedup"]["median"] == pytest.approx(0.53, abs=0.01)
    assert v["ttft"]["met"] is False
    assert v["ttft"]["median"] == pytest.approx(4.54, abs=0.01)
    assert v["all_answered"]["met"] is True  # slow, but nobody refused


def test_one_error_or_one_lost_request_fails_all_answered() -> None:
    for bad in (
        Generation(0.0, 0.1, None, 0, code="no_healthy_pipeline"),
        Generation(0.0, None, None, 0),
    ):
        rnd = _round(GOOD)
        gens = [*_users(7, seconds=3.5, ttft=1.0), bad]
        rnd["levels"]["8"] = level_figures(gens)
        v = verdicts([_round(GOOD), rnd])
        assert v["all_answered"]["met"] is False
        assert (v["all_answered"]["errors"], v["all_answered"]["lost"]) in ((1, 0), (0, 1))


def test_a_wrong_text_at_eight_fails_the_speed_target_however_fast() -> None:
    rnd = _round(GOOD)
    rnd["levels"]["8"] = {**rnd["levels"]["8"], "wrong": 1}
    assert verdicts([rnd])["speedup"]["met"] is False
    assert verdicts([rnd])["ttft"]["met"] is False


def test_targets_whose_levels_did_not_run_are_not_judged() -> None:
    v = verdicts([_round({1: (2.0, 0.5), 2: (2.0, 0.6)})])
    assert v["speedup"]["met"] is None
    assert v["ttft"]["met"] is None
    assert v["all_answered"]["met"] is True
    assert verdicts([])["all_answered"]["met"] is None


def test_a_round_with_no_answer_alone_cannot_meet_the_speed_target() -> None:
    lonely = _round(GOOD)
    lonely["levels"]["1"] = level_figures([Generation(0.0, None, None, 0)])
    v = verdicts([_round(GOOD), lonely, _round(GOOD)])
    assert v["speedup"]["rounds"][1] is None
    assert v["speedup"]["met"] is False  # a round that could not be measured


def test_over_rounds_sums_counts_and_takes_the_median_round_of_each_figure() -> None:
    slow = {n: (s * 2, t * 2) for n, (s, t) in GOOD.items()}
    fast = {n: (s / 2, t / 2) for n, (s, t) in GOOD.items()}
    levels = over_rounds([_round(slow), _round(GOOD), _round(fast)])
    assert levels["8"]["sent"] == 24
    assert levels["8"]["rounds"] == 3
    assert levels["1"]["aggregate_tokens_per_s"] == 16.0  # the middle round's
    assert levels["1"]["ttft_p50_ms"] == 500.0
    assert list(levels) == ["1", "2", "4", "8", "16"]


@given(
    alone=st.lists(st.floats(1.0, 50.0), min_size=1, max_size=5),
    factor=st.lists(st.floats(0.1, 10.0), min_size=5, max_size=5),
)
def test_the_speed_verdict_is_the_median_round_ratio_against_four(
    alone: list[float], factor: list[float]
) -> None:
    rounds = [
        {
            "levels": {
                "1": {**level_figures(_users(1, seconds=1, ttft=0.1)), "aggregate_tokens_per_s": a},
                "8": {
                    **level_figures(_users(8, seconds=1, ttft=0.1)),
                    "aggregate_tokens_per_s": a * k,
                },
            }
        }
        for a, k in zip(alone, factor, strict=False)
    ]
    v = verdicts(rounds)["speedup"]
    ratios = sorted(
        round(
            r["levels"]["8"]["aggregate_tokens_per_s"] / r["levels"]["1"]["aggregate_tokens_per_s"],
            3,
        )
        for r in rounds
    )
    assert v["met"] == (v["median"] >= 4.0)
    assert min(ratios) <= v["median"] <= max(ratios)


def test_levels_rotate_and_each_user_has_a_prompt_of_its_own() -> None:
    assert [order([1, 2, 4], r) for r in range(4)] == [
        [1, 2, 4],
        [2, 4, 1],
        [4, 1, 2],
        [1, 2, 4],
    ]
    assert len(set(PROMPTS)) == len(PROMPTS) == 16
    assert len(set(prompts_for(16, 3))) == 16
    assert prompts_for(2, 1) == [PROMPTS[1], PROMPTS[2]]
    assert deadline_s(16, 48) > deadline_s(1, 48) >= 60


def _at_16(aggregate: float, one: float | None, *, wrong: int = 0, ttft: float = 0.5) -> Any:
    """A round whose 16 users made ``aggregate`` tokens/s in all, each first token after
    ``ttft`` s, beside one process batching 16 sessions at ``one`` tokens/s."""
    seconds = 16 * 48 / aggregate
    users = [Generation(0.0, seconds, ttft, 48) for _ in range(16)]
    rnd: dict[str, Any] = {"levels": {"16": level_figures(users)}}
    if one is not None:
        rnd["one_process"] = {
            "sessions": 16,
            "tokens": 768,
            "ttft_ms": 40.0,
            "aggregate_tokens_per_s": one,
            "wrong": wrong,
        }
    return rnd


def test_the_swarm_at_16_users_is_judged_against_one_process_in_the_same_rounds() -> None:
    v = against_one_process([_at_16(300, 400), _at_16(310, 420), _at_16(290, 400)])
    assert v["over_one_process"]["rounds"] == pytest.approx([0.75, 0.738, 0.725], abs=1e-3)
    assert v["over_one_process"]["met"] is True
    assert v["aggregate"]["met"] is True
    assert v["ttft_p99"]["met"] is True
    assert verdicts([_at_16(300, 400)])["one_process"]["over_one_process"]["met"] is True
    slow = against_one_process([_at_16(140, 560), _at_16(150, 560), _at_16(145, 560)])
    assert slow["over_one_process"]["met"] is False
    assert slow["aggregate"]["met"] == "undecided"  # 140-150 spans 150
    late = against_one_process([_at_16(300, 400, ttft=1.5)] * 3)
    assert late["ttft_p99"]["met"] is False


def test_rounds_on_both_sides_of_a_target_leave_it_undecided() -> None:
    v = against_one_process([_at_16(290, 500), _at_16(310, 500), _at_16(350, 500)])
    assert v["over_one_process"]["met"] == "undecided"  # 0.58, 0.62, 0.70


def test_a_wrong_baseline_text_an_error_or_a_missing_baseline_decide_nothing_good() -> None:
    wrong = [_at_16(300, 400, wrong=1)] * 3
    assert against_one_process(wrong)["over_one_process"]["met"] is False
    assert failed_checks(wrong)[0] == "one process, 16 sessions (round 1): 1 texts wrong"
    refused = _at_16(300, 400)
    refused["levels"]["16"] = level_figures(
        [*[Generation(0.0, 2.5, 0.5, 48)] * 15, Generation(0.0, 0.1, None, 0, code="overloaded")]
    )
    v = against_one_process([refused, _at_16(300, 400), _at_16(300, 400)])
    assert (v["aggregate"]["met"], v["over_one_process"]["met"], v["ttft_p99"]["met"]) == (
        False,
        False,
        False,
    )
    older = against_one_process([_at_16(300, None)])
    assert older["over_one_process"]["met"] is None
    assert against_one_process([{"levels": {}}])["aggregate"]["met"] is None


def test_cpu_is_counted_per_answered_token_by_part_of_the_swarm() -> None:
    from hecate_dev.bench.llm_concurrency import USERS, cpu_per_token

    before = {"node a-0": 1.0, "node a-1": 2.0, "router-1": 0.5, "gateway": 0.0, USERS: 3.0}
    after = {"node a-0": 1.4, "node a-1": 2.2, "router-1": 0.55, "gateway": 0.02, USERS: 3.1}
    assert cpu_per_token(before, after, 200) == {
        "gateway": 0.1,
        "nodes": 3.0,
        "routers": 0.25,
        USERS: 0.5,
    }
    assert cpu_per_token(before, after, 0) == {}
    gone = cpu_per_token({"node a-0": 1.0}, {}, 10)  # a process gone since: nothing more
    assert gone == {"nodes": 0.0}


def test_the_report_shows_where_the_cpu_goes_at_each_level() -> None:
    first, second = _round(GOOD), _round(GOOD)
    first["cpu"] = {"1": {"nodes": 4.0, "routers": 0.2}, "16": {"nodes": 7.0}}
    second["cpu"] = {"1": {"nodes": 5.0, "routers": 0.4}, "16": {"nodes": 8.0}}
    doc = render(_with(_users_result(first, second)))
    section = _section(doc, "SmolLM2-135M")
    assert "| users at once | nodes | routers | all |" in section
    assert "| 1 | 5.00 | 0.40 | 5.40 |" in section  # each part's median of two: the upper
    assert "| 16 | 8.00 | – | 8.00 |" in section


def test_levels_are_parsed_strictly() -> None:
    assert parse_levels("1,2,4,8,16") == (1, 2, 4, 8, 16)
    for bad in ("", "0,1", "1,1", "a", "-2"):
        with pytest.raises(ValueError, match="distinct whole numbers"):
            parse_levels(bad)
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


# -- the report --------------------------------------------------------------------------


def _section(doc: str, title: str) -> str:
    start = doc.index(f"## {title}")
    end = doc.find("\n## ", start + 1)
    return " ".join(doc[start : end if end >= 0 else len(doc)].split())


def _users_result(*rounds: dict[str, Any]) -> dict[str, Any]:
    return {
        "levels": over_rounds(list(rounds)),
        "rounds": list(rounds),
        "meta": {
            "levels": [1, 2, 4, 8, 16],
            "tokens": 32,
            "rounds": len(rounds),
            "prompts": 16,
            "reference": "in this process with the numpy model, before the swarm starts",
            "deadline_s": {"1": 76.0, "16": 316.0},
            "swarm": "hecate up --topology examples/smollm2.json",
        },
    }


def _with(users: dict[str, Any]) -> dict[str, Any]:
    out = results()
    out["llm"]["report"] = {**copy.deepcopy(out["llm"]["report"]), "concurrency": users}
    return out


def test_the_report_prints_a_row_per_level_and_the_verdicts_from_the_figures() -> None:
    today = _round(TODAY)
    gens = [
        *_users(1, seconds=30.0, ttft=2.2),
        *[Generation(0.0, 3.0, None, 0, code="unrecoverable")] * 7,
    ]
    today["levels"]["8"] = level_figures(gens)
    doc = render(_with(_users_result(today)), img="pictures")
    section = _section(doc, "SmolLM2-135M")
    assert "### Many users at once" in section
    assert (
        "| 8 | 1 / 8 | `unrecoverable` 7 | 0 | 0 | 1.1 | 1.1 | 2.20 / 2.20 | all right |" in section
    )
    assert "| 1 | 1 / 1 | 0 | 0 | 0 | 16.0 | 16.0 | 0.50 / 0.50 | all right |" in section
    assert "(pictures/bench-llm-concurrency.png)" in section
    headline = _section(doc, "Headline")
    assert (
        "| many users: every request answered at every level (0 errors, 0 lost) "
        "| 24 of 31 answered; 7 errors (`unrecoverable` 7), 0 lost | **not met** |"
    ) in headline
    assert (
        "| many users: aggregate tokens/s at 8 at once ≥ 4× the 1-user figure "
        "| 0.07× (per round: 0.07) | **not met** |"
    ) in headline
    assert "| many users: TTFT p99 at 8 at once ≤ 3× the 1-user TTFT | 4.40× " in headline


def test_the_readme_figures_carry_the_many_users_ratios() -> None:
    block = figures(_with(_users_result(_round(GOOD), _round(GOOD))))
    assert "| many users: aggregate tokens/s at 8 at once ≥ 4× the 1-user figure | 4.48×" in block
    assert "| many users: TTFT p99 at 8 at once ≤ 3× the 1-user TTFT | 2.14×" in block
    assert block.count("| met |") >= 3


def test_an_older_result_without_the_many_users_part_says_so_and_draws_nothing() -> None:
    doc = render(results())
    assert "| many users: aggregate tokens/s at 8 at once ≥ 4× the 1-user figure | not run" in (
        _section(doc, "Headline")
    )
    assert ("bench-llm-concurrency.png", "llm") not in pictures(results())
    assert ("bench-llm-concurrency.png", "llm") in pictures(_with(_users_result(_round(GOOD))))


def test_a_many_users_run_alone_is_reported_with_the_rest_not_run() -> None:
    users = _users_result(_round(GOOD))
    out = results()
    out["llm"]["report"] = {"concurrency": users, "failed_checks": [], "meta": {"tokens": 32}}
    doc = render(out)
    section = _section(doc, "SmolLM2-135M")
    assert "Only the many-users part ran (`--only-concurrency`)" in section
    headline = _section(doc, "Headline")
    assert (
        "| 3 stages ≥ 0.9× single process, every core (tokens/s) | not run | not measured |"
    ) in headline
    assert "| every timed generation gives the single-process text | all equal | met |" in (
        headline
    )
