"""Many users at once (``hecate bench llm --concurrency 1,2,4,8,16,32``): the figures of
each concurrency level and the verdicts against the targets, from what every generation
saw. Pure: generations in, figures out; :mod:`hecate_dev.bench.llm_concurrency` runs them.

Per level and round:

* ``sent`` (users) / ``answered`` (an answer, right or wrong) / ``errors`` (the swarm's
  last word was an error reply, by code) / ``lost`` (the last send got no reply by the
  deadline) / ``wrong`` (answered, but the text, as replied or as streamed, is not the
  prompt's single-user greedy text) / ``resent`` (sends beyond each user's first: a
  refusal's Retry-After honoured, or a silent send given up);
* ``aggregate_tokens_per_s``: every token streamed by the answered generations ÷ the
  wall time from the first send to the last reply;
* ``per_user_tokens_per_s``: the median answered generation's tokens ÷ its time from
  its first send to its reply (what one user sees, waits and the first token's
  included);
* ``ttft_p50_ms`` / ``ttft_p99_ms``: first streamed token after the user's first send,
  over the generations that streamed one.

Over rounds, counts add up and each figure is the median round's. The ratios the
targets are about (8 users against 1) are taken within each round, then the median:
the machine's speed drifts over minutes, and a ratio within one round cancels most of
it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hecate_dev.bench.interval import Verdict, median_interval

# Distinct prompts, so that no cache or coincidence can make two users' answers equal.
PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "Water boils at a temperature of",
    "The largest planet in the solar system is",
    "A good way to learn a new language is",
    "The first person to walk on the moon was",
    "Photosynthesis is the process by which",
    "The main ingredient of bread is",
    "In computer science, a hash table is",
    "The tallest mountain on Earth is",
    "A healthy breakfast usually includes",
    "The speed of light is about",
    "Shakespeare wrote a play called",
    "The chemical symbol for gold is",
    "Bees are important because they",
    "The Pacific Ocean is",
    "To make a cup of tea, first",
)

DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32)
TARGET_AT = 8  # the level the scaling targets are about
TARGET_SPEEDUP = 4.0  # aggregate tokens/s at TARGET_AT ≥ this x the 1-user figure
TARGET_TTFT = 3.0  # TTFT p99 at TARGET_AT ≤ this x the 1-user TTFT p50
# The swarm against one process, at BASELINE_SESSIONS users (the engine's targets):
BASELINE_SESSIONS = 16  # the one-process baseline batches this many sessions
TARGET_AGGREGATE = 150.0  # aggregate tokens/s at BASELINE_SESSIONS users ≥ this
TARGET_OVER_ONE = 0.6  # ... ≥ this x one process batching as many sessions, same round
TARGET_TTFT_MS = 1000.0  # TTFT p99 at BASELINE_SESSIONS users ≤ this


@dataclass(frozen=True)
class Generation:
    """What one user saw, on one clock (seconds): when it sent, when its first token and
    its reply came (``None``: never), how many distinct tokens it streamed, the error
    code of an error reply ("" for an answer) and whether an answer's text was right."""

    sent: float
    replied: float | None
    first_token: float | None
    tokens: int
    code: str = ""
    text_ok: bool = True
    sends: int = 1  # a refusal's Retry-After honoured, or a silent send given up: more

    @property
    def answered(self) -> bool:
        return self.replied is not None and not self.code


def parse_levels(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4): distinct whole numbers ≥ 1, in the order given; raises
    ValueError on anything else."""
    why = f"expected distinct whole numbers ≥ 1 such as 1,2,4,8,16: {text!r}"
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(why) from None
    if not levels or min(levels) < 1 or len(set(levels)) != len(levels):
        raise ValueError(why)
    return levels


def order(levels: Sequence[int], round_index: int) -> list[int]:
    """The levels in the order round ``round_index`` runs them: rotated by one each
    round, so that no level always runs first (on a cold swarm) or right after the
    heaviest."""
    k = round_index % len(levels) if levels else 0
    return [*levels[k:], *levels[:k]]


def prompts_for(level: int, round_index: int) -> list[str]:
    """The ``level`` prompts of one level in one round: consecutive in :data:`PROMPTS`,
    starting one further each round (more than 16 users repeat prompts)."""
    return [PROMPTS[(round_index + i) % len(PROMPTS)] for i in range(level)]


def deadline_s(level: int, tokens: int) -> float:
    """How long a user waits before its request counts as lost: a minute, plus half a
    second per token of the whole level (2 tokens/s for everyone together, far below
    what the swarm serves one user)."""
    return 60.0 + 0.5 * level * tokens


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation, as numpy computes it."""
    if not values:
        raise ValueError("percentile of no values")
    return float(np.percentile(np.asarray(values, dtype=float), q))


def level_figures(gens: Sequence[Generation]) -> dict[str, Any]:
    """One level's figures in one round (see the module's docstring)."""
    answered = [g for g in gens if g.answered]
    errors: dict[str, int] = {}
    for g in gens:
        if g.replied is not None and g.code:
            errors[g.code] = errors.get(g.code, 0) + 1
    tokens = sum(g.tokens for g in answered)
    start = min((g.sent for g in gens), default=0.0)
    end = max((g.replied for g in gens if g.replied is not None), default=start)
    per_user = [
        g.tokens / (g.replied - g.sent)
        for g in answered
        if g.replied is not None and g.replied > g.sent
    ]
    ttft = [(g.first_token - g.sent) * 1000 for g in gens if g.first_token is not None]
    return {
        "sent": len(gens),
        "answered": len(answered),
        "errors": sum(errors.values()),
        "errors_by_code": errors,
        "lost": sum(1 for g in gens if g.replied is None),
        "resent": sum(max(0, g.sends - 1) for g in gens),
        "wrong": sum(1 for g in answered if not g.text_ok),
        "tokens": tokens,
        "wall_s": round(end - start, 3),
        "aggregate_tokens_per_s": round(tokens / (end - start), 2) if end > start else 0.0,
        "per_user_tokens_per_s": round(float(np.median(per_user)), 2) if per_user else 0.0,
        "ttft_p50_ms": round(percentile(ttft, 50), 1) if ttft else None,
        "ttft_p99_ms": round(percentile(ttft, 99), 1) if ttft else None,
    }


FIGURES = ("aggregate_tokens_per_s", "per_user_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms")
COUNTS = ("sent", "answered", "errors", "lost", "wrong", "tokens", "resent")


def _median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=float)))


def over_rounds(rounds: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every level's figures over the rounds (``rounds``: each ``{"levels": {level:
    figures}}``, levels as strings, as saved): counts summed, errors by code summed, each
    figure the median of the rounds' (a round with no first token gives no TTFT)."""
    levels: dict[str, list[Mapping[str, Any]]] = {}
    for rnd in rounds:
        for level, figures in rnd["levels"].items():
            levels.setdefault(str(level), []).append(figures)
    out: dict[str, dict[str, Any]] = {}
    for level in sorted(levels, key=int):
        runs = levels[level]
        merged: dict[str, Any] = {k: sum(int(r.get(k, 0)) for r in runs) for k in COUNTS}
        codes: dict[str, int] = {}
        for r in runs:
            for code, n in r["errors_by_code"].items():
                codes[code] = codes.get(code, 0) + int(n)
        merged["errors_by_code"] = codes
        for k in FIGURES:
            seen = [float(r[k]) for r in runs if r.get(k) is not None]
            merged[k] = round(_median(seen), 2) if seen else None
        merged["rounds"] = len(runs)
        out[level] = merged
    return out


def _ratios(
    rounds: Sequence[Mapping[str, Any]], over: tuple[str, str], under: tuple[str, str]
) -> list[float | None]:
    """Per round, figure ``over`` (level, key) ÷ figure ``under``; None in a round where
    either is missing or the divisor is zero."""
    out: list[float | None] = []
    for rnd in rounds:
        levels = rnd["levels"]
        a = (levels.get(over[0]) or {}).get(over[1])
        b = (levels.get(under[0]) or {}).get(under[1])
        out.append(round(float(a) / float(b), 3) if a is not None and b else None)
    return out


def _median_ratio(ratios: Sequence[float | None]) -> float | None:
    """The median round's ratio; None unless every round has one (a round that could
    not be measured is not a round that met the target)."""
    if not ratios or any(r is None for r in ratios):
        return None
    return round(_median([r for r in ratios if r is not None]), 3)


def _judged(values: Sequence[float | None], target: float, at_least: bool) -> Verdict | None:
    """Per-round figures against ``target``: met or not only when the interval for their
    median (:func:`hecate_dev.bench.interval.median_interval`) lies on one side of it,
    else ``"undecided"``; None when some round lacks the figure."""
    if not values or any(v is None for v in values):
        return None
    interval = median_interval([float(v) for v in values if v is not None])
    return interval.verdict_at_least(target) if at_least else interval.verdict_at_most(target)


def against_one_process(
    rounds: Sequence[Mapping[str, Any]], at: int = BASELINE_SESSIONS
) -> dict[str, Any]:
    """The swarm at ``at`` users against the targets of the engine: aggregate tokens/s
    ≥ :data:`TARGET_AGGREGATE`, and ≥ :data:`TARGET_OVER_ONE` x the same round's one
    process batching ``at`` sessions (``one_process``), TTFT p99 ≤
    :data:`TARGET_TTFT_MS`; each judged over the rounds' figures (None: not measured). A
    wrong text at that level, or in the baseline, fails the ratio; a round with an
    error or a lost user at that level fails all three."""
    key = str(at)
    runs = [rnd["levels"].get(key) for rnd in rounds]
    ones = [rnd.get("one_process") for rnd in rounds]
    aggregate = [None if f is None else f.get("aggregate_tokens_per_s") for f in runs]
    ttft = [None if f is None else f.get("ttft_p99_ms") for f in runs]
    ratios: list[float | None] = [
        round(float(f["aggregate_tokens_per_s"]) / float(o["aggregate_tokens_per_s"]), 3)
        if f is not None
        and o
        and f.get("aggregate_tokens_per_s") is not None
        and o.get("aggregate_tokens_per_s")
        else None
        for f, o in zip(runs, ones, strict=True)
    ]
    failed = any(f is not None and (f["errors"] or f["lost"]) for f in runs)
    wrong = any(f is not None and f["wrong"] for f in runs) or any(
        o is not None and o.get("wrong") for o in ones
    )

    def verdict(values: Sequence[float | None], target: float, at_least: bool) -> Verdict | None:
        met = _judged(values, target, at_least)
        return False if met is not None and failed else met

    over = verdict(ratios, TARGET_OVER_ONE, True)
    return {
        "at": at,
        "aggregate": {
            "met": verdict(aggregate, TARGET_AGGREGATE, True),
            "rounds": aggregate,
            "target": TARGET_AGGREGATE,
        },
        "over_one_process": {
            "met": False if over is not None and wrong else over,
            "rounds": ratios,
            "one_process": [None if o is None else o.get("aggregate_tokens_per_s") for o in ones],
            "target": TARGET_OVER_ONE,
        },
        "ttft_p99": {
            "met": verdict(ttft, TARGET_TTFT_MS, False),
            "rounds": ttft,
            "target": TARGET_TTFT_MS,
        },
    }


def verdicts(rounds: Sequence[Mapping[str, Any]], at: int = TARGET_AT) -> dict[str, Any]:
    """The targets against the figures of ``rounds`` (as saved: ``{"levels": {...}}``):
    each ``met`` is True, False, or None when the levels it needs were not run.

    * ``all_answered``: every request at every level answered (no error, none lost);
    * ``texts_right``: every answer's text is its prompt's single-user greedy text;
    * ``speedup``: aggregate tokens/s at ``at`` users ≥ :data:`TARGET_SPEEDUP` x at 1,
      the median of the per-round ratios; a wrong text at either level fails it;
    * ``ttft``: TTFT p99 at ``at`` ≤ :data:`TARGET_TTFT` x TTFT p50 at 1, likewise."""
    levels = over_rounds(rounds)
    ran = bool(levels)
    all_answered = ran and all(
        f["errors"] == 0 and f["lost"] == 0 and f["answered"] == f["sent"] for f in levels.values()
    )
    wrong = sum(f["wrong"] for f in levels.values())
    both = {"1", str(at)} <= set(levels)
    wrong_at = both and any(levels[k]["wrong"] for k in ("1", str(at)))
    speedups = _ratios(rounds, (str(at), "aggregate_tokens_per_s"), ("1", "aggregate_tokens_per_s"))
    ttfts = _ratios(rounds, (str(at), "ttft_p99_ms"), ("1", "ttft_p50_ms"))
    speedup, ttft = _median_ratio(speedups), _median_ratio(ttfts)
    return {
        "one_process": against_one_process(rounds),
        "all_answered": {
            "met": all_answered if ran else None,
            "errors": sum(f["errors"] for f in levels.values()),
            "lost": sum(f["lost"] for f in levels.values()),
            "sent": sum(f["sent"] for f in levels.values()),
            "answered": sum(f["answered"] for f in levels.values()),
        },
        "texts_right": {"met": wrong == 0 if ran else None, "wrong": wrong},
        "speedup": {
            "met": (speedup is not None and speedup >= TARGET_SPEEDUP and not wrong_at)
            if both
            else None,
            "median": speedup,
            "rounds": speedups,
            "target": TARGET_SPEEDUP,
            "at": at,
        },
        "ttft": {
            "met": (ttft is not None and ttft <= TARGET_TTFT and not wrong_at) if both else None,
            "median": ttft,
            "rounds": ttfts,
            "target": TARGET_TTFT,
            "at": at,
        },
    }


def failed_checks(rounds: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every level and round whose answers had a wrong text, and every round whose
    one-process baseline did, by name."""
    failed = [
        f"concurrency {level} (round {i + 1}): {f['wrong']} of {f['answered']} texts wrong"
        for i, rnd in enumerate(rounds)
        for level, f in rnd["levels"].items()
        if f["wrong"]
    ]
    for i, rnd in enumerate(rounds):
        one = rnd.get("one_process") or {}
        if one.get("wrong"):
            failed.append(
                f"one process, {one['sessions']} sessions (round {i + 1}): "
                f"{one['wrong']} texts wrong"
            )
    return failed
