"""``hecate bench prefix``'s serial arm without a swarm: how a turn's reuse is read from
the nodes' STATS and the gateway's metrics, its figures, its verdict, and the report."""

from __future__ import annotations

import argparse
import re
from typing import Any

import pytest

from hecate_dev.bench.cli import _arms
from hecate_dev.bench.prefix_serial import (
    Counts,
    SerialArm,
    SerialTurn,
    attribute,
    counts_of,
    outcome,
    question,
    routed,
    serial_figures,
    serial_round,
    summary,
    verdict,
)
from hecate_dev.bench.report import render
from tests.dev.bench_results import results


def _stats(node: str, hits: int, misses: int, reused: int) -> dict[str, Any]:
    data = {"prefixes": {"hits": hits, "misses": misses, "reused_positions": reused, "kept": 2}}
    return {
        "id": node,
        "endpoints": [{"name": "run", "data": data}, {"name": "release", "data": None}],
    }


def test_a_nodes_counts_come_from_its_stats_answer() -> None:
    assert counts_of(_stats("alpha-0", 3, 1, 960)) == ("alpha-0", Counts(3, 1, 960))
    assert counts_of({"id": "toy", "endpoints": [{"data": {}}]}) == ("toy", Counts())


def test_the_gateways_outcomes_are_read_from_its_metrics() -> None:
    text = "\n".join(
        [
            "# HELP hecate_gateway_prefix_routed_total Answered turns by where",
            "# TYPE hecate_gateway_prefix_routed_total counter",
            'hecate_gateway_prefix_routed_total{model="smollm2-135m",outcome="toward"} 5.0',
            'hecate_gateway_prefix_routed_total{model="smollm2-135m",outcome="none"} 2.0',
            'hecate_gateway_prefix_routed_total{model="toy",outcome="toward"} 9.0',
            'hecate_gateway_prefix_routed_created{model="smollm2-135m",outcome="none"} 1.7e9',
        ]
    )
    assert routed(text, "smollm2-135m") == {"toward": 5, "none": 2}
    assert outcome({"toward": 5, "none": 2}, {"toward": 6, "none": 2}) == "toward"
    assert outcome({"toward": 5}, {"toward": 5, "elsewhere": 1}) == "elsewhere"
    assert outcome({}, {}) == ""


def test_each_turn_gets_what_its_first_stage_counted_until_the_next_send() -> None:
    turns = [SerialTurn(0.5, 520, "a", first_stage="a0"), SerialTurn(0.1, 560, "b")]
    turns[1].first_stage = "b0"
    snaps = [
        {"a0": Counts(0, 4, 0), "b0": Counts(2, 1, 900)},
        {"a0": Counts(0, 5, 0), "b0": Counts(2, 1, 900)},  # turn 1: a0 missed
        {"a0": Counts(0, 5, 0), "b0": Counts(3, 1, 1412)},  # turn 2: b0 took 512 positions
    ]
    outcomes = [{"none": 3}, {"none": 4}, {"none": 4, "toward": 1}]
    attribute(turns, snaps, outcomes)
    assert (turns[0].counts, turns[0].reused, turns[0].outcome) == (Counts(0, 1, 0), False, "none")
    assert (turns[1].counts, turns[1].reused, turns[1].outcome) == (
        Counts(1, 0, 512),
        True,
        "toward",
    )
    # A first stage missing from a reading (or no route at all) counts nothing.
    lost = [SerialTurn(None, 0, "", "APIError", first_stage="")]
    attribute(lost, snaps[:2], outcomes[:2])
    assert lost[0].counts == Counts()
    assert not lost[0].reused


def test_every_chat_is_its_own_user_apart_from_the_burst_arms_readers() -> None:
    prompts = {question(c, 0) for c in range(16)}
    assert len(prompts) == 16
    assert all(q.startswith("Visitor ") for q in prompts)
    assert question(0, 1) != question(0, 0)


def _turn(
    ttft: float, hit: bool, text: str = "the second floor", first: bool = False
) -> SerialTurn:
    t = SerialTurn(ttft, 600, text, first_stage="n0", gap_s=0.002)
    t.counts = Counts(1, 0, 512) if hit else Counts(0, 1, 0)
    t.outcome = "toward" if hit else "none"
    if first:
        t.gap_s = 9.0  # a first turn's gap is never a next turn's
        t.prompt_tokens = 500  # 480 in whole blocks: the next turn's 512 hold it all
    return t


def _arm(reuse: bool, ttfts: list[float], hits: int) -> SerialArm:
    """Chats of 3 turns; the first ``hits`` next turns reused."""
    arm = SerialArm(reuse, wall_s=12.34)
    n = 0
    for c in range(len(ttfts) // 2):
        chat = [_turn(1.0, False, first=True)]
        for t in ttfts[2 * c : 2 * c + 2]:
            chat.append(_turn(t, n < hits))
            n += 1
        arm.chats.append(chat)
    for turn in (t for chat in arm.chats for t in chat if not reuse):
        turn.counts, turn.outcome = Counts(), "none"  # no prompt looked up, none counted
    return arm


def test_the_serial_figures_count_next_turns_only() -> None:
    f = serial_figures(_arm(True, [0.2, 0.3, 0.4, 0.9], hits=3))
    assert f["next_turns"] == 4
    assert f["next_turns_reused"] == 3
    assert f["next_turns_reused_history"] == 2  # turn 3's 512 of turn 2's 600: not all
    assert f["reused_by_turn"] == [0, 2, 1]
    assert f["by_chat"] == ["0/500 512/600 512/600", "0/500 512/600 0/600"]
    assert f["ttft_p50_ms_next"] == 350.0
    assert f["ttft_max_ms_next"] == 900.0
    assert f["ttft_p50_ms_first"] == 1000.0
    assert (f["prompt_tokens_next"], f["tokens_from_cache_next"]) == (2400, 1536)
    assert f["gateway_outcomes_next"] == {"none": 1, "toward": 3}
    assert f["gap_ms_max"] == 2.0
    assert f["stats_unclear"] == 0  # one lookup a turn with reuse on
    assert (f["errors"], f["wall_s"]) == (0, 12.3)
    assert serial_figures(_arm(False, [0.2, 0.3], hits=0))["stats_unclear"] == 0
    # A turn whose first stage counted no lookup with reuse on (or one without) is unclear.
    odd = _arm(True, [0.2, 0.3], hits=1)
    odd.chats[0][2].counts = Counts()
    assert serial_figures(odd)["stats_unclear"] == 1
    odd = _arm(False, [0.2, 0.3], hits=0)
    odd.chats[0][0].counts = Counts(0, 1, 0)
    assert serial_figures(odd)["stats_unclear"] == 1


def test_a_round_holds_its_ratios_and_the_answers_that_differ() -> None:
    on, off = _arm(True, [0.2, 0.3, 0.4, 0.9], 4), _arm(False, [1.0, 1.2, 1.4, 1.8], 0)
    off.chats[1][2].text = "the third floor"
    rnd = serial_round(on, off)
    assert (rnd["ttft_p50_ratio"], rnd["ttft_max_ratio"]) == (0.269, 0.5)
    assert (rnd["reused_share"], rnd["turns_that_differ"]) == (1.0, 1)


@pytest.mark.parametrize(
    ("shares", "said"),
    [
        ([1.0, 0.9375], "met"),  # 15/16 is enough
        ([1.0, 0.9374], "not met"),
        ([0.0], "not met"),
        ([], "undecided"),
        ([1.0, None], "undecided"),  # a round with no next turn
    ],
)
def test_the_serial_verdict_asks_every_round_for_15_of_16(
    shares: list[float | None], said: str
) -> None:
    assert verdict(shares) == said


def test_the_arms_flag_takes_each_arm_once() -> None:
    assert _arms("serial") == ("serial",)
    assert _arms("burst, serial,burst") == ("burst", "serial")
    for bad in ("", "solo", "burst,solo"):
        with pytest.raises(argparse.ArgumentTypeError):
            _arms(bad)


def _section(doc: str) -> str:
    start = doc.index("## Chats that resend their prompt")
    end = doc.find("\n## ", start + 1)
    return " ".join(doc[start:end].split())


def _with_serial(*, burst: bool, reused: int = 12) -> dict[str, dict[str, Any]]:
    out = results()
    on, off = _arm(True, [0.2, 0.3] * 6, reused), _arm(False, [1.0, 1.2] * 6, 0)
    rnd = serial_round(on, off)
    report = out["prefix"]["report"]
    if not burst:
        report.clear()
        report["arms"] = ["serial"]
    report["serial"] = {**summary([rnd], 6, 3), "max_tokens": 12}
    report.setdefault("failed_checks", [])
    return out


def test_the_report_shows_the_serial_arm_beside_the_burst_arm() -> None:
    doc = render(_with_serial(burst=True))
    section = _section(doc)
    assert "TTFT p50 at turn 3, with ÷ without, per round: 0.200, 0.183 (2 rounds)" in section
    assert "On the same swarms, after the users at once: 6 chats, one after another" in section
    on = "| 1 on | 12/12 (6) | 250 | 300 | 1,000 | 6,144 of 7,200 | toward 12 | 12.3 | 0 |"
    assert on in section
    off = "| 1 off | 0/12 (0) | 1,100 | 1,200 | 1,000 | 0 of 7,200 | none 12 | 12.3 | 0 |"
    assert off in section
    assert "p50 0.227; max 0.250." in section
    assert "per round: 12/12 (1 rounds), against at least 15/16 in every round: met" in section
    assert "did not read as one lookup" not in section
    headline = " ".join(doc[doc.index("## Headline") :].split())
    assert (
        "| one chat at a time: next turns reused with prefix reuse ≥ 15/16 | 12/12 (1 rounds) "
        "| met |"
    ) in headline
    for line in doc.splitlines():
        if not line.startswith(("|", "![", "#")) and not re.search(r"`[^`]{60,}`", line):
            assert len(line) <= 88, line


def test_a_serial_arm_alone_says_what_swarm_it_ran_on_and_can_fail() -> None:
    doc = render(_with_serial(burst=False, reused=11))
    section = _section(doc)
    assert "users chat at once" not in section
    assert "is started afresh with prefix reuse on" in section
    assert "11/12 (1 rounds), against at least 15/16 in every round: not met" in section
    headline = " ".join(doc[doc.index("## Headline") :].split())
    assert "| 11/12 (1 rounds) | **not met** |" in headline
    assert "TTFT p50 at turn" not in headline


def test_a_result_from_before_the_serial_arm_reads_as_it_did() -> None:
    section = _section(render(results()))
    assert "one after another" not in section
    assert section.endswith("Every answer with reuse was the answer without, turn by turn: yes.")
