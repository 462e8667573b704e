"""The many-users part of the SmolLM2 section (``hecate bench llm --concurrency``): a
table per level, the picture, and the targets judged from the saved rounds."""

# Prose for people: its dashes and multiplication signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from typing import Any

import msgspec

from hecate_dev.bench.concurrency import (
    BASELINE_SESSIONS,
    TARGET_AGGREGATE,
    TARGET_AT,
    TARGET_OVER_ONE,
    TARGET_SPEEDUP,
    TARGET_TTFT,
    TARGET_TTFT_MS,
    verdicts,
)
from hecate_dev.bench.report.markdown import Doc, Target, num, table, verdict
from hecate_dev.bench.results_llm import Level, OneProcess, Users

PICTURE = "bench-llm-concurrency.png"
WRONG = "failed: wrong text"

ANSWERED = "many users: every request answered at every level (0 errors, 0 lost)"
SPEEDUP = (
    f"many users: aggregate tokens/s at {TARGET_AT} at once ≥ {TARGET_SPEEDUP:g}× the 1-user figure"
)
TTFT = f"many users: TTFT p99 at {TARGET_AT} at once ≤ {TARGET_TTFT:g}× the 1-user TTFT"
AT = BASELINE_SESSIONS
AGGREGATE = f"many users: aggregate tokens/s at {AT} at once ≥ {TARGET_AGGREGATE:g}"
OVER_ONE = (
    f"many users: aggregate tokens/s at {AT} at once ≥ {TARGET_OVER_ONE:g}× one process "
    f"batching {AT} sessions, same rounds"
)
TTFT_MS = f"many users: TTFT p99 at {AT} at once ≤ {TARGET_TTFT_MS / 1000:g} s"


def not_run(why: str = "not run") -> list[Target]:
    """The many-users targets of a run that did not measure them."""
    return [Target(t, why, None) for t in (ANSWERED, SPEEDUP, TTFT, AGGREGATE, OVER_ONE, TTFT_MS)]


def _seconds(ms: float | None) -> str:
    return "–" if ms is None else num(ms / 1000, 2)


def _codes(codes: dict[str, int]) -> str:
    return ", ".join(f"`{c}` {n:,}" for c, n in sorted(codes.items())) or "0"


def _speed(x: float | None) -> str:
    return "–" if x is None else num(x, 1)


def _rows(levels: dict[str, Level]) -> list[list[str]]:
    rows = []
    for level, f in levels.items():
        wrong = f.wrong
        rows.append(
            [
                level,
                f"{f.answered:,} / {f.sent:,}",
                _codes(f.errors_by_code),
                f"{f.lost:,}",
                f"{f.resent:,}",
                WRONG if wrong else _speed(f.aggregate_tokens_per_s),
                WRONG if wrong else _speed(f.per_user_tokens_per_s),
                f"{_seconds(f.ttft_p50_ms)} / {_seconds(f.ttft_p99_ms)}",
                f"**{wrong:,} wrong**" if wrong else "all right" if f.answered else "–",
            ]
        )
    return rows


def _ratio(v: Doc, level: str, figure: str) -> str:
    median = v["median"]
    if v["met"] is None:
        return f"no level of {TARGET_AT} users in this run"
    if median is None:
        return f"no {figure} at 1 or {level} users in some round"
    rounds = ", ".join("–" if x is None else num(x, 2) for x in v["rounds"])
    return f"{num(median, 2)}× (per round: {rounds})"


def _per_round(values: list[Any], unit: str, digits: int) -> str:
    if not values or any(v is None for v in values):
        return "not measured in every round"
    shown = ", ".join(num(float(v), digits) for v in values)
    middle = sorted(float(v) for v in values)[len(values) // 2]
    return f"{num(middle, digits)}{unit} in the median round (per round: {shown})"


def _engine_targets(v: Doc) -> list[Target]:
    """The swarm at 16 users against the engine's targets, as the verdicts judged them."""
    one = v["one_process"]
    agg, over, ttft = one["aggregate"], one["over_one_process"], one["ttft_p99"]
    baseline = ", ".join("–" if x is None else num(float(x), 1) for x in over["one_process"])
    return [
        Target(AGGREGATE, _per_round(agg["rounds"], " tokens/s", 1), agg["met"]),
        Target(
            OVER_ONE,
            f"{_per_round(over['rounds'], '×', 3)}; one process: {baseline} tokens/s",
            over["met"],
        ),
        Target(
            TTFT_MS,
            _per_round([None if x is None else x / 1000 for x in ttft["rounds"]], " s", 2),
            ttft["met"],
        ),
    ]


def _baseline(users: Users) -> str:
    """The one-process rows: the median round's, and how many texts were wrong."""
    ones = [r.one_process for r in users.rounds if r.one_process is not None]
    if not ones:
        return ""
    mid: OneProcess = sorted(ones, key=lambda o: o.aggregate_tokens_per_s)[len(ones) // 2]
    wrong = sum(o.wrong for o in ones)
    return (
        f"Beside it, in every round, while the swarm stood idle, one process: "
        f"{users.meta.one_process}. "
        f"Median round: {mid.sessions} sessions, {mid.tokens:,} tokens, "
        f"{num(mid.aggregate_tokens_per_s, 1)} tokens/s in all, first tokens after "
        f"{num(mid.ttft_ms / 1000, 2)} s; texts: "
        + (f"**{wrong} wrong**" if wrong else "all right")
        + ".\n"
    )


def _cpu_table(users: Users) -> str:
    """Milliseconds of CPU per answered token by part of the swarm, each level's median
    over the rounds; empty for results saved before it was read."""
    by_level: dict[str, dict[str, list[float]]] = {}
    for rnd in users.rounds:
        for level, used in rnd.cpu.items():
            for part, ms in used.items():
                by_level.setdefault(level, {}).setdefault(part, []).append(ms)
    if not by_level:
        return ""
    parts = sorted({p for level in by_level.values() for p in level})
    rows = []
    for level in sorted(by_level, key=int):
        medians = {p: sorted(v)[len(v) // 2] for p, v in by_level[level].items()}
        shown = [num(medians[p], 2) if p in medians else "–" for p in parts]
        rows.append([level, *shown, num(sum(medians.values()), 2)])
    text = table(["users at once", *parts, "all"], rows)
    return (
        "Where the CPU goes (ms of CPU per answered token, each level's median round; "
        "user and system time of every process, read from `/proc` around each level; "
        "the users' clients run on the same two cores, in the bench's own process):\n\n"
        f"{text}\n"
    )


def section(users: Users, img: str) -> tuple[str, list[Target]]:
    """The many-users text and its targets, from the saved ``concurrency`` result."""
    meta = users.meta
    # Judged again from the saved rounds, by the rule the suite applies to its own.
    v = verdicts(msgspec.to_builtins(users.rounds))
    levels = users.levels
    answered, speedup, ttft = v["all_answered"], v["speedup"], v["ttft"]
    codes: dict[str, int] = {}
    for f in levels.values():
        for code, n in f.errors_by_code.items():
            codes[code] = codes.get(code, 0) + n
    answered_figure = (
        f"{answered['answered']:,} of {answered['sent']:,} answered; "
        f"{answered['errors']:,} errors{f' ({_codes(codes)})' if codes else ''}, "
        f"{answered['lost']:,} lost"
    )
    at = str(TARGET_AT)
    speed_figure = _ratio(speedup, at, "tokens/s")
    ttft_figure = _ratio(ttft, at, "TTFT")
    if v["texts_right"]["wrong"]:
        speed_figure = f"{speed_figure}; {WRONG}" if speedup["met"] is not None else speed_figure
    table_text = table(
        [
            "users at once",
            "answered / sent",
            "errors (by code)",
            "lost",
            "resent",
            "aggregate tokens/s",
            "per-user tokens/s",
            "TTFT p50 / p99 (s)",
            "text",
        ],
        _rows(levels),
    )
    engine = _engine_targets(v)
    engine_text = "".join(f"* **{t.what}**: {verdict(t.met)} ({t.figure}).\n" for t in engine)
    if engine_text:
        engine_text = (
            "\nThe same levels against one process (each judged over the rounds: met or not "
            "only when the interval for the median round's figure lies on one side of the "
            "target, else undecided):\n\n" + engine_text
        )
    n = meta.rounds
    rounds_text = "one round" if n == 1 else f"{n} rounds (the level order rotated each round)"
    text = f"""### Many users at once

The swarm `make run` starts (`{meta.swarm}`: telemetry, planner, breaker
service, two routers, six nodes making two 3-stage pipelines, each process with the
command `hecate up` gives it),
on its own embedded nats-server. At each level N, N users send at once, each through
{meta.via}, each with its own prompt
(from a set of {meta.prompts}), greedy, {meta.tokens} tokens; {rounds_text}. A
user's client honours a refusal's Retry-After and sends at most 3 times (`resent`: sends
beyond the first); a send with no reply after
{num(max(meta.deadline_s.values()), 0)} s at the most (a minute plus half a second
per token of the level) is given up, and a user whose last send got none is lost; an
error is the swarm's last word. Counts add up over the rounds; each figure is the
median round's. Aggregate tokens/s: every answered token of a level ÷ the time from the
first send to the last reply; per-user: the median user's tokens ÷ its own time from
first send to reply; TTFT: from the first send to the first streamed token. Every
answer's text ({"as streamed" if "gateway" in meta.via else "as replied and as streamed"})
is compared with its prompt's single-user greedy text, computed {meta.reference}.

{table_text}

{_baseline(users)}
{_cpu_table(users)}
![aggregate and per-user tokens/s, and TTFT p50 and p99, against users at once]({img}/{PICTURE})

Against the targets (ratios taken within each round, then the median round):

* **{ANSWERED}**: {verdict(answered["met"])} ({answered_figure}).
* **{SPEEDUP}**: {verdict(speedup["met"])} ({speed_figure}).
* **{TTFT}** (its p50 at 1 user): {verdict(ttft["met"])} ({ttft_figure}).
* **every answer's text is its single-user greedy text**:
  {verdict(v["texts_right"]["met"])} ({v["texts_right"]["wrong"]:,} wrong).
{engine_text}"""
    return text, [
        Target(ANSWERED, answered_figure, answered["met"]),
        Target(SPEEDUP, speed_figure, speedup["met"]),
        Target(TTFT, ttft_figure, ttft["met"]),
        *engine,
    ]


def has_picture(report: Any) -> bool:
    """Whether a saved llm result has the many-users figures to draw."""
    return isinstance(report, dict) and bool((report.get("concurrency") or {}).get("levels"))
