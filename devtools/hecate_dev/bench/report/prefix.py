"""The prefix-reuse section: chats resending a long system prompt and their history,
with the nodes' cached prefixes on and off (``hecate bench prefix``,
:mod:`hecate_dev.bench.prefix`): many users at once (the burst arm) and one chat after
another (the serial arm, :mod:`hecate_dev.bench.prefix_serial`), either or both."""

# Prose for people: its dashes and multiplication signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from typing import Any

from hecate_dev.bench.report.markdown import Doc, Met, Target, num, provenance, skipped, table

TARGET = 0.5  # TTFT p50 at the last turn with reuse, at most half of without
SERIAL_TARGET = "15/16"  # the serial arm's next turns reused, at least, every round


def section_prefix(env: Doc, img: str) -> tuple[str, list[Target]]:
    del img  # no picture
    r = env["report"]
    title = "## Chats that resend their prompt: prefix reuse on and off\n\n"
    if (absent := skipped(env, title)) is not None:
        return absent, []
    text, targets = f"{title}{provenance(env)}\n", []
    if "rounds" in r:  # the burst arm ran (every result before the serial arm was added)
        burst, target = _burst(r)
        text, targets = text + burst, [target]
    if "serial" in r:
        serial, target = _serial(r["serial"], after_burst=bool(targets))
        text, targets = text + ("\n" if targets else "") + serial, [*targets, target]
    return text, targets


def _burst(r: dict[str, Any]) -> tuple[str, Target]:
    rows = []
    for i, rnd in enumerate(r["rounds"], 1):
        for arm in ("on", "off"):
            a = rnd[arm]
            rows.append(
                [
                    f"{i} {arm}",
                    ", ".join(num(x, 0) for x in a["ttft_p50_ms_by_turn"]),
                    num(a["prompt_tokens"], 0),
                    num(a["prefill_tokens_computed"], 0),
                    num(a["wall_s"], 1),
                    str(a["errors"]),
                ]
            )
    ratios = r["last_turn_ttft_ratios"]
    met: Met = {"met": True, "not met": False}.get(r["verdict"], "undecided")
    figure = ", ".join(num(x, 3) for x in ratios) + f" ({len(ratios)} rounds)"
    differ = sum(rnd["turns_that_differ"] for rnd in r["rounds"])
    text = (
        f"{r['users']} users chat at once through the gateway of `make run`'s swarm (two "
        "3-stage pipelines of SmolLM2, routers chaining the stages), each an official "
        f"`openai` client streaming {r['turns']} turns of `/v1/chat/completions` (greedy, "
        f"{r['max_tokens']} tokens a turn); every turn resends the same ~500-token system "
        "prompt, the user's earlier questions and answers, and a new question. The swarm "
        "is started afresh for each arm: as `hecate up` starts it (prefix reuse on), and "
        "with every router given `--no-prefix-cache` (off); the arms alternate which runs "
        "first. TTFT is the client's; prompt tokens are the gateway's usage; tokens "
        "computed are those less the positions the nodes took from cache (their STATS).\n\n"
        + table(
            ["round, reuse", "TTFT p50 by turn (ms)", "prompt tokens", "computed", "s", "errors"],
            rows,
        )
        + f"\n\nTTFT p50 at turn {r['turns']}, with ÷ without, per round: {figure}. "
        "Every answer with reuse was the answer without, turn by turn: "
        + ("yes." if not differ else f"NO ({differ} turns differ).")
        + "\n"
    )
    return text, Target(
        f"TTFT p50 at turn {r['turns']} with prefix reuse ≤ {TARGET}× without", figure, met
    )


def _ms(x: float | None) -> str:
    return "–" if x is None else num(x, 0)


def _ratio(x: float | None) -> str:
    return "–" if x is None else num(x, 3)


def _serial(s: dict[str, Any], *, after_burst: bool) -> tuple[str, Target]:
    rows = []
    for i, rnd in enumerate(s["rounds"], 1):
        for arm in ("on", "off"):
            a = rnd[arm]
            outcomes = ", ".join(f"{k} {v}" for k, v in a["gateway_outcomes_next"].items())
            rows.append(
                [
                    f"{i} {arm}",
                    f"{a['next_turns_reused']}/{a['next_turns']} "
                    f"({a['next_turns_reused_history']})",
                    _ms(a["ttft_p50_ms_next"]),
                    _ms(a["ttft_max_ms_next"]),
                    _ms(a["ttft_p50_ms_first"]),
                    f"{num(a['tokens_from_cache_next'], 0)} of {num(a['prompt_tokens_next'], 0)}",
                    outcomes or "–",
                    num(a["wall_s"], 1),
                    str(a["errors"]),
                ]
            )
    rounds = s["rounds"]
    met: Met = {"met": True, "not met": False}.get(s["verdict"], "undecided")
    reused = ", ".join(
        f"{rnd['on']['next_turns_reused']}/{rnd['on']['next_turns']}" for rnd in rounds
    )
    figure = f"{reused} ({len(rounds)} rounds)"
    differ = sum(rnd["turns_that_differ"] for rnd in rounds)
    unclear = sum(rnd[arm]["stats_unclear"] for rnd in rounds for arm in ("on", "off"))
    gap = max(
        (rnd[arm]["gap_ms_max"] or 0.0 for rnd in rounds for arm in ("on", "off")), default=0.0
    )
    text = (
        (
            "On the same swarms, after the users at once: "
            if after_burst
            else "`make run`'s swarm (two 3-stage pipelines of SmolLM2, routers chaining the "
            "stages) is started afresh with prefix reuse on (as `hecate up` starts it) and "
            "off (every router given `--no-prefix-cache`), the arms alternating which runs "
            "first; on each, through its gateway: "
        )
        + f"{s['chats']} chats, one after another, each its own user, through an official "
        "`openai` client streaming `/v1/chat/completions` (greedy) as an agent loop sends "
        f"its turns: {s['turns']} turns each "
        f"({s['max_tokens']} tokens a turn), each next turn sent as soon as the previous "
        f"answer's stream ended (at most {num(gap, 1)} ms later). A next turn (2 to "
        f"{s['turns']}) reused when its first stage, the node its answer's route names "
        "first, counted a hit in its `$SRV.STATS` prefix counts while the turn ran; in "
        "brackets, those that took at least the previous turn's whole prompt (in whole "
        "blocks) from cache: their own history, not the shared system prompt alone. Tokens "
        "from cache are that stage's positions taken from cache; the gateway's outcomes "
        "are where it counted the router sent each next turn "
        "(`hecate_gateway_prefix_routed_total`).\n\n"
        + table(
            [
                "round, reuse",
                "next turns reused (whole history)",
                "TTFT p50 (ms)",
                "TTFT max (ms)",
                "turn 1 TTFT p50 (ms)",
                "tokens from cache",
                "gateway outcomes",
                "s",
                "errors",
            ],
            rows,
        )
        + "\n\nNext turns' TTFT, with ÷ without, per round: p50 "
        + ", ".join(_ratio(rnd["ttft_p50_ratio"]) for rnd in rounds)
        + "; max "
        + ", ".join(_ratio(rnd["ttft_max_ratio"]) for rnd in rounds)
        + f". Next turns reused with reuse on, per round: {figure}, against at least "
        f"{SERIAL_TARGET} in every round: {s['verdict']}. "
        + (
            f"Turns whose STATS did not read as one lookup (or none, off): {unclear}. "
            if unclear
            else ""
        )
        + "Every answer with reuse was the answer without, turn by turn: "
        + ("yes." if not differ else f"NO ({differ} turns differ).")
        + "\n"
    )
    return text, Target(
        f"one chat at a time: next turns reused with prefix reuse ≥ {SERIAL_TARGET}", figure, met
    )
