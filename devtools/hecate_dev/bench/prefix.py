"""``hecate bench prefix``: chats that resend a long system prompt and their history every
turn, with prefix reuse on and off, in the same run.

The swarm is ``make run``'s (:func:`hecate_dev.bench.gateway_swarm.standing`: two routers
with chained dispatch, six nodes making two 3-stage pipelines of SmolLM2, the gateway),
started afresh for each arm: *on* as ``hecate up`` starts it, *off* with every router
given ``--no-prefix-cache``; the arms alternate which goes first, round by round.

In each arm, ``users`` users chat at once through the gateway, each an official
``openai`` client of its own (``AsyncOpenAI``) streaming ``/v1/chat/completions``
(greedy, ``max_tokens`` a turn): every turn sends the shared system prompt (about 500
tokens, :data:`SYSTEM`), the user's earlier questions and the answers it got, and a new
question; the next turn starts when the answer is in. Each turn's time to first token
(TTFT) is measured by the client; the prompt tokens are the gateway's usage figures, the
tokens taken from cache are the nodes' own count (``$SRV.STATS``: positions each stage
took from a cached prefix, over the three stages of a pipeline). A user's answers in the
*on* arm must equal its answers in the *off* arm of the same round, turn by turn (a
reused prefix's numbers are the ones a whole prompt computes): any that differs is
counted wrong, and fails the run.

The target: TTFT p50 at the last turn with reuse at most 0.5 of without, judged on the
rounds' ratios (:func:`verdict`).

That is the *burst* arm. On the same swarm, after it, the *serial* arm
(:mod:`hecate_dev.bench.prefix_serial`) runs one chat after another, each next turn sent
as soon as the previous answer's stream ended, as an agent loop sends them, and counts the
next turns whose first stage started from a cached prefix. ``Shape.arms`` (``hecate bench
prefix --arms``) picks the arms; the burst arm's figures keep their keys at the top of the
result, the serial arm's are under ``"serial"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import nats
import openai
from openai.types.chat import ChatCompletionMessageParam

from hecate.wire import subjects
from hecate_dev.bench.gateway_swarm import Standing, bench_env, standing, wait_serving
from hecate_dev.bench.interval import median_interval
from hecate_launcher import node_env

if TYPE_CHECKING:
    from hecate_dev.bench.prefix_serial import SerialArm

MODEL = "smollm2-135m"
TOPOLOGY = "smollm2.json"
TARGET = 0.5
ARMS = ("burst", "serial")  # many users at once; one user at a time
TOPICS = (
    "whales", "volcanoes", "bread", "chess", "bridges", "comets", "bees", "knots",
    "violins", "glaciers", "maps", "tea", "owls", "clocks", "coral", "kites",
)  # fmt: skip
SYSTEM = " ".join(
    [
        "You are the help desk of the Northbridge public library, a building of four floors.",
        "The ground floor holds the returns desk, newspapers, magazines and the cafe.",
        "The first floor holds fiction, sorted by the author's family name from A to Z.",
        "Crime, fantasy and science fiction have their own shelves at the end of fiction.",
        "The second floor holds non-fiction, sorted by the Dewey decimal classification.",
        "History and geography are in the 900s, near the windows on the north side.",
        "Science is in the 500s and technology in the 600s, beside the study tables.",
        "The arts, music and sport are in the 700s, next to the listening booths.",
        "The third floor holds the children's library, picture books and school projects.",
        "Large-print books and audiobooks are on the ground floor, beside the lift.",
        "Rare books are kept in a locked room on the third floor; ask staff to see them.",
        "Members may borrow twelve items for three weeks and renew them twice online.",
        "A lost card costs two pounds to replace; bring proof of address to the desk.",
        "Printing costs ten pence a page in black and white and fifty pence in colour.",
        "The library opens at nine and closes at eight on weekdays, at five on Saturdays.",
        "It is closed on Sundays and on public holidays, and the book drop is always open.",
        "Study rooms can be booked for two hours a day, up to a week in advance.",
        "Never make up a title, an author or a shelf: if you do not know, say so and",
        "suggest asking a librarian at the desk on the floor where the question belongs.",
        "Answer in one or two short sentences, name the floor, and be friendly but brief.",
        "Do not give legal, medical or financial advice; point to the relevant section.",
        "If a reader asks for a book that is on loan, offer to reserve it for them.",
        "Reservations are free and the reader is told by email when the book is back.",
        "Interlibrary loans take about two weeks and cost one pound fifty per item.",
        "The library's wifi is free; the password is printed on every study table.",
    ]
)


@dataclass
class Turn:
    ttft_s: float | None  # None: no first token (an error, or no answer)
    prompt_tokens: int
    text: str
    error: str = ""


@dataclass
class Arm:
    reuse: bool
    turns: list[list[Turn]] = field(default_factory=list)  # per user, per turn
    reused_positions: int = 0  # over every stage of every node
    wall_s: float = 0.0


@dataclass(frozen=True)
class Shape:
    """Which arms run (:data:`ARMS`), and the serial arm's chats and turns per chat."""

    arms: tuple[str, ...] = ARMS
    chats: int = 16
    turns: int = 4


def question(user: int, turn: int) -> str:
    topic = TOPICS[(user + 3 * turn) % len(TOPICS)]
    return f"Reader {user + 1} asks: where would I find books about {topic}, and for how long?"


async def stream_turn(
    client: openai.AsyncOpenAI, messages: list[ChatCompletionMessageParam], max_tokens: int
) -> tuple[Turn, str]:
    """One turn streamed (greedy), timed from its send to its first text; and the route
    its answer's last frame names in its ``hecate`` field (the stages' nodes in order, ""
    if none came)."""
    sent, first, parts, prompt, error, route = time.perf_counter(), None, [], 0, "", ""
    try:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            delta = chunk.choices[0].delta.content if chunk.choices else None
            if delta:
                first = first or time.perf_counter()
                parts.append(delta)
            if chunk.usage is not None:
                prompt = chunk.usage.prompt_tokens
            hecate = (chunk.model_extra or {}).get("hecate")
            if isinstance(hecate, dict) and hecate.get("route"):
                route = str(hecate["route"])
    except openai.APIError as exc:  # an error status, or an error event in the stream
        status = getattr(exc, "status_code", None)
        error = f"{type(exc).__name__} {status or ''}: {exc}"[:300]
    ttft = None if first is None else first - sent
    return Turn(ttft, prompt, "".join(parts), error), route


async def _chat(base: str, user: int, turns: int, max_tokens: int, wait_s: float) -> list[Turn]:
    client = openai.AsyncOpenAI(
        base_url=f"{base}/v1", api_key="bench", max_retries=4, timeout=wait_s
    )
    messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": SYSTEM}]
    out: list[Turn] = []
    try:
        for t in range(turns):
            messages.append({"role": "user", "content": question(user, t)})
            turn, _ = await stream_turn(client, messages, max_tokens)
            out.append(turn)
            messages.append({"role": "assistant", "content": turn.text})
    finally:
        await client.close()
    return out


async def _reused(url: str) -> int:
    """Positions every node's stages took from cached prefixes so far."""
    nc = await nats.connect(url)
    total = 0
    try:
        name = subjects.SERVICE_NAMES["node"]
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish(f"$SRV.STATS.{name}", b"", reply=inbox)
        with contextlib.suppress(TimeoutError, nats.errors.TimeoutError):
            while True:
                msg = await sub.next_msg(timeout=1.0)
                for e in json.loads(msg.data).get("endpoints", []):
                    data = e.get("data") or {}
                    total += int((data.get("prefixes") or {}).get("reused_positions", 0))
    finally:
        await nc.close()
    return total


def _arm(
    workdir: Path, reuse: bool, users: int, turns: int, tokens: int, shape: Shape
) -> tuple[Arm | None, SerialArm | None]:
    """One swarm standing, reuse on or off: the burst arm, then the serial arm on it
    (those of ``shape.arms``; None for an arm not run)."""
    from hecate_dev.bench.prefix_serial import run_serial
    from hecate_dev.chaos.scenarios import topology

    (workdir / TOPOLOGY).write_bytes(topology(TOPOLOGY))
    env = node_env(bench_env(HECATE_STATE=str(workdir)))  # as hecate up runs them
    router_args = () if reuse else ("--no-prefix-cache",)
    with standing(workdir, workdir / TOPOLOGY, env, router_args=router_args) as st:
        wait_serving(st, MODEL, 180.0)
        burst = serial = None
        if "burst" in shape.arms:
            burst = asyncio.run(_users(st, reuse, users, turns, tokens))
        if "serial" in shape.arms:
            serial = asyncio.run(run_serial(st, reuse, shape.chats, shape.turns, tokens))
        return burst, serial


async def _users(st: Standing, reuse: bool, users: int, turns: int, tokens: int) -> Arm:
    arm = Arm(reuse)
    before = await _reused(st.url)
    started = time.perf_counter()
    arm.turns = list(
        await asyncio.gather(*(_chat(st.base, u, turns, tokens, 600.0) for u in range(users)))
    )
    arm.wall_s = time.perf_counter() - started
    arm.reused_positions = await _reused(st.url) - before
    return arm


def _p50(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def arm_figures(arm: Arm, stages: int = 3) -> dict[str, Any]:
    turns = max((len(u) for u in arm.turns), default=0)
    per_turn = []
    for t in range(turns):
        ttfts = [s for u in arm.turns if len(u) > t and (s := u[t].ttft_s) is not None]
        per_turn.append(round(1000 * (_p50(ttfts) or 0.0), 1))
    prompt = sum(turn.prompt_tokens for u in arm.turns for turn in u)
    reused = arm.reused_positions // stages
    return {
        "prefix_reuse": arm.reuse,
        "ttft_p50_ms_by_turn": per_turn,
        "prompt_tokens": prompt,
        "prefill_tokens_computed": prompt - reused,
        "tokens_from_cache": reused,
        "errors": sum(bool(turn.error) or turn.ttft_s is None for u in arm.turns for turn in u),
        "error_examples": sorted({turn.error for u in arm.turns for turn in u if turn.error})[:5],
        "wall_s": round(arm.wall_s, 1),
    }


class Texted(Protocol):
    text: str


def differing(on: Sequence[Sequence[Texted]], off: Sequence[Sequence[Texted]]) -> int:
    """Turns whose text with reuse differs from the same user's (or chat's) turn without."""
    return sum(
        a.text != b.text for ua, ub in zip(on, off, strict=True)
        for a, b in zip(ua, ub, strict=True)
    )  # fmt: skip


def wrong(on: Arm, off: Arm) -> int:
    """Turns whose text with reuse differs from the same user's turn without."""
    return differing(on.turns, off.turns)


def verdict(ratios: Sequence[float]) -> str:
    """The rounds' ratios against :data:`TARGET` (at most), by the interval of their
    median (:mod:`hecate_dev.bench.interval`; with few rounds, their whole range)."""
    if not ratios:
        return "undecided"
    said = median_interval(ratios).verdict_at_most(TARGET)
    if said == "undecided":
        return "undecided"
    return "met" if said else "not met"


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="hecate-prefix-") as tmp:
        yield Path(tmp)


def _burst_round(r: int, on_arm: Arm, off_arm: Arm, failed: list[str]) -> dict[str, Any]:
    on, off = arm_figures(on_arm), arm_figures(off_arm)
    last_on, last_off = on["ttft_p50_ms_by_turn"][-1], off["ttft_p50_ms_by_turn"][-1]
    ratio = round(last_on / last_off, 3) if last_off else None
    bad = wrong(on_arm, off_arm)
    if bad or on["errors"] or off["errors"]:
        failed.append(
            f"round {r + 1}: {bad} turns differ; {on['errors']} errors with reuse, "
            f"{off['errors']} without"
        )
    return {"on": on, "off": off, "last_turn_ttft_ratio": ratio, "turns_that_differ": bad}


def run(
    *,
    users: int = 16,
    turns: int = 8,
    tokens: int = 12,
    rounds: int = 2,
    shape: Shape | None = None,
) -> dict[str, Any]:
    from hecate_dev.bench import prefix_serial

    shape = shape or Shape()

    out_rounds: list[dict[str, Any]] = []
    serial_rounds: list[dict[str, Any]] = []
    failed: list[str] = []
    for r in range(rounds):
        bursts: dict[bool, Arm | None] = {}
        serials: dict[bool, SerialArm | None] = {}
        for reuse in (True, False) if r % 2 == 0 else (False, True):
            with _workdir() as tmp:
                bursts[reuse], serials[reuse] = _arm(tmp, reuse, users, turns, tokens, shape)
        if (on := bursts[True]) is not None and (off := bursts[False]) is not None:
            out_rounds.append(_burst_round(r, on, off, failed))
        if (s_on := serials[True]) is not None and (s_off := serials[False]) is not None:
            rnd = prefix_serial.serial_round(s_on, s_off)
            failed += prefix_serial.failed(r, rnd)
            serial_rounds.append(rnd)
    out: dict[str, Any] = {"arms": list(shape.arms)}
    if "burst" in shape.arms:
        ratios = [x for rnd in out_rounds if (x := rnd["last_turn_ttft_ratio"]) is not None]
        out |= {
            "users": users,
            "turns": turns,
            "max_tokens": tokens,
            "rounds": out_rounds,
            "last_turn_ttft_ratios": ratios,
            "target": f"TTFT p50 at turn {turns} with reuse <= {TARGET} of without",
            "verdict": verdict(ratios),
        }
    if "serial" in shape.arms:
        summary = prefix_serial.summary(serial_rounds, shape.chats, shape.turns)
        out["serial"] = {**summary, "max_tokens": tokens}
    out["failed_checks"] = failed
    return out
