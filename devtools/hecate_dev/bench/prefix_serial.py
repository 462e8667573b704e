"""``hecate bench prefix``'s serial arm: one user at a time, each next turn sent the moment
the previous answer's stream ended, as an agent loop sends them.

It runs on the swarm the burst arm of :mod:`hecate_dev.bench.prefix` stands on (after it,
in the same round), with prefix reuse on and off. ``chats`` chats run one after another,
each of ``turns`` turns, each its own user on its own topic (:func:`question`: a visitor,
numbered apart from the burst arm's readers, so that no chat finds a prefix the burst arm
left): an official ``openai`` client (``AsyncOpenAI``) streaming
``/v1/chat/completions`` greedily, every turn resending its system prompt (the burst
arm's, named for its visitor first: :func:`system`, so that no two chats share a
prefix), the chat's earlier questions and answers, and a new question.

Whether a turn reused a cached prefix is the nodes' own count: every node's ``$SRV.STATS``
prefix counts are asked for as each turn is sent (the turn waits for nothing), and again
after the last. A turn reused when its first stage (the node its answer's last frame names
first in the route of its ``hecate`` field) counted a hit between its send and the next:
it started from cached positions, its own history, since no other chat shares its prefix
(how many: ``reused_positions``; at least the previous turn's whole prompt, in whole
blocks: :func:`whole_history`). One turn at a time, nothing else moves those
counts; the first stage looks a prompt up once a turn (a hit or a miss) with reuse on and
never without, and a turn whose counts say otherwise is counted ``stats_unclear``. The
gateway's ``hecate_gateway_prefix_routed_total`` is read the same way: where the router
sent each turn as to a prefix it knew kept.

Each chat's answers with reuse must equal its answers without, turn by turn. The target:
at least 15/16 of the next turns (2 to ``turns``) reused, in every round's on arm
(:func:`verdict`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import nats
import openai
from nats.aio.subscription import Subscription
from openai.types.chat import ChatCompletionMessageParam

from hecate.llm.prefixes import BLOCK
from hecate.wire import subjects
from hecate_dev.bench.gateway_swarm import Standing
from hecate_dev.bench.prefix import MODEL, SYSTEM, TOPICS, differing, stream_turn

TARGET = 15 / 16  # next turns reused, at least, in every round with reuse on
ASKS = (
    "where would I find books about {topic}, and for how long may I borrow them?",
    "is there a quiet room near the books about {topic} where I could read them?",
    "can I reserve a book about {topic} that someone else has on loan now?",
    "could I print a page from a book about {topic}, and what would it cost me?",
)


def system(chat: int) -> str:
    """A chat's system prompt: the burst arm's, named for its visitor first, so that no
    two chats share a prefix and a turn that starts from one found its own history."""
    return f"This desk serves visitor {chat + 1}. {SYSTEM}"


def question(chat: int, turn: int) -> str:
    topic = TOPICS[chat % len(TOPICS)]
    return f"Visitor {chat + 1} asks: " + ASKS[turn % len(ASKS)].format(topic=topic)


@dataclass(frozen=True)
class Counts:
    """A node's prefix counts (``$SRV.STATS``), or the change in them over a turn."""

    hits: int = 0
    misses: int = 0
    reused_positions: int = 0

    def __sub__(self, other: Counts) -> Counts:
        return Counts(
            self.hits - other.hits,
            self.misses - other.misses,
            self.reused_positions - other.reused_positions,
        )


Snapshot = dict[str, Counts]  # node id -> its counts


@dataclass
class SerialTurn:
    ttft_s: float | None  # None: no first token (an error, or no answer)
    prompt_tokens: int
    text: str
    error: str = ""
    first_stage: str = ""  # the node the answer's route names first ("": none)
    gap_s: float = 0.0  # from the previous answer's end to this send
    counts: Counts = field(default_factory=Counts)  # its first stage's, over the turn
    outcome: str = ""  # the gateway's prefix_routed outcome ("": none counted)

    @property
    def reused(self) -> bool:
        return self.counts.hits >= 1


@dataclass
class SerialArm:
    reuse: bool
    chats: list[list[SerialTurn]] = field(default_factory=list)  # per chat, per turn
    wall_s: float = 0.0
    stats_missed: int = 0  # snapshots some node did not answer


# -- reading the counts -------------------------------------------------------------------
def counts_of(reply: Mapping[str, Any]) -> tuple[str, Counts]:
    """A node's id and its prefix counts, from its ``$SRV.STATS`` answer."""
    hits = misses = reused = 0
    for e in reply.get("endpoints") or []:
        p = (e.get("data") or {}).get("prefixes") or {}
        hits += int(p.get("hits", 0))
        misses += int(p.get("misses", 0))
        reused += int(p.get("reused_positions", 0))
    return str(reply.get("id", "")), Counts(hits, misses, reused)


_ROUTED = re.compile(r"^hecate_gateway_prefix_routed_total\{([^}]*)\}\s+(\S+)", re.MULTILINE)


def routed(metrics: str, model: str) -> dict[str, int]:
    """The gateway's answered turns of ``model`` by prefix outcome, from its /metrics."""
    out: dict[str, int] = {}
    for labels, value in _ROUTED.findall(metrics):
        got = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if got.get("model") == model:
            out[got.get("outcome", "")] = int(float(value))
    return out


def outcome(before: Mapping[str, int], after: Mapping[str, int]) -> str:
    """The outcomes counted between two readings ("": none; several joined by "+")."""
    return "+".join(sorted(k for k, v in after.items() if v > before.get(k, 0)))


def attribute(
    turns: Sequence[SerialTurn], snaps: Sequence[Snapshot], outcomes: Sequence[Mapping[str, int]]
) -> None:
    """Each turn's first-stage counts and gateway outcome: what changed between the
    reading taken at its send (``snaps[i]``) and the next (``snaps[i + 1]``)."""
    for i, turn in enumerate(turns):
        before, after = snaps[i], snaps[i + 1]
        node = turn.first_stage
        if node in before and node in after:
            turn.counts = after[node] - before[node]
        turn.outcome = outcome(outcomes[i], outcomes[i + 1])


async def _ask(nc: nats.NATS) -> Subscription:
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(f"$SRV.STATS.{subjects.SERVICE_NAMES['node']}", b"", reply=inbox)
    return sub


async def _collect(sub: Subscription, expect: int, wait_s: float) -> Snapshot:
    """Every answer to the STATS asked on ``sub``: ``expect`` of them (0: as many as
    come within ``wait_s`` of the last)."""
    out: Snapshot = {}
    with contextlib.suppress(TimeoutError, nats.errors.TimeoutError):
        while not expect or len(out) < expect:
            msg = await sub.next_msg(timeout=wait_s)
            node, counts = counts_of(json.loads(msg.data))
            out[node] = counts
    await sub.unsubscribe()
    return out


async def _routed(http: httpx.AsyncClient, base: str) -> dict[str, int]:
    with contextlib.suppress(httpx.HTTPError):
        return routed((await http.get(f"{base}/metrics", timeout=10.0)).text, MODEL)
    return {}


# -- the arm ------------------------------------------------------------------------------
async def run_serial(st: Standing, reuse: bool, chats: int, turns: int, tokens: int) -> SerialArm:
    arm = SerialArm(reuse)
    nc = await nats.connect(st.url)
    http = httpx.AsyncClient()
    every: list[SerialTurn] = []
    readings: list[tuple[asyncio.Task[Snapshot], asyncio.Task[dict[str, int]]]] = []
    try:
        nodes = len(await _collect(await _ask(nc), 0, 1.0))

        async def read() -> None:  # asked now, answered while the turn runs
            sub = await _ask(nc)
            stats = asyncio.create_task(_collect(sub, nodes, 5.0))
            readings.append((stats, asyncio.create_task(_routed(http, st.base))))

        started = ended = time.perf_counter()
        for c in range(chats):
            client = openai.AsyncOpenAI(
                base_url=f"{st.base}/v1", api_key="bench", max_retries=4, timeout=600.0
            )
            messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": system(c)}]
            chat: list[SerialTurn] = []
            try:
                for t in range(turns):
                    messages.append({"role": "user", "content": question(c, t)})
                    await read()
                    gap = time.perf_counter() - ended
                    got, route = await stream_turn(client, messages, tokens)
                    ended = time.perf_counter()
                    turn = SerialTurn(got.ttft_s, got.prompt_tokens, got.text, got.error)
                    turn.first_stage, turn.gap_s = route.split(",")[0], gap
                    chat.append(turn)
                    messages.append({"role": "assistant", "content": got.text})
            finally:
                await client.close()
            arm.chats.append(chat)
            every += chat
        arm.wall_s = time.perf_counter() - started
        await read()
        snaps = [await s for s, _ in readings]
        outcomes = [await o for _, o in readings]
    finally:
        for s, o in readings:
            s.cancel()
            o.cancel()
        await http.aclose()
        await nc.close()
    arm.stats_missed = sum(len(s) < nodes for s in snaps)
    attribute(every, snaps, outcomes)
    return arm


# -- figures ------------------------------------------------------------------------------
def _ms(x: float | None) -> float | None:
    return None if x is None else round(1000 * x, 1)


def whole_history(chat: Sequence[SerialTurn]) -> int:
    """Next turns of a chat that took at least the whole of the previous turn's prompt
    from cache (as far as it fills blocks of :data:`~hecate.llm.prefixes.BLOCK`): the
    whole of their own history, not part of it."""
    return sum(
        0 < prev.prompt_tokens // BLOCK * BLOCK <= turn.counts.reused_positions
        for prev, turn in itertools.pairwise(chat)
    )


def serial_figures(arm: SerialArm) -> dict[str, Any]:
    nxt = [turn for chat in arm.chats for turn in chat[1:]]
    ttfts = [s for turn in nxt if (s := turn.ttft_s) is not None]
    firsts = [s for chat in arm.chats if chat and (s := chat[0].ttft_s) is not None]
    everything = [turn for chat in arm.chats for turn in chat]
    outcomes: dict[str, int] = {}
    for turn in nxt:
        outcomes[turn.outcome or "uncounted"] = outcomes.get(turn.outcome or "uncounted", 0) + 1
    lookups = 1 if arm.reuse else 0
    return {
        "prefix_reuse": arm.reuse,
        "next_turns": len(nxt),
        "next_turns_reused": sum(turn.reused for turn in nxt),
        "next_turns_reused_history": sum(whole_history(chat) for chat in arm.chats),
        "ttft_p50_ms_next": _ms(statistics.median(ttfts) if ttfts else None),
        "ttft_max_ms_next": _ms(max(ttfts, default=None)),
        "ttft_p50_ms_first": _ms(statistics.median(firsts) if firsts else None),
        "prompt_tokens_next": sum(turn.prompt_tokens for turn in nxt),
        "tokens_from_cache_next": sum(turn.counts.reused_positions for turn in nxt),
        "reused_by_turn": [
            sum(len(chat) > t and chat[t].reused for chat in arm.chats)
            for t in range(max((len(chat) for chat in arm.chats), default=0))
        ],
        "gateway_outcomes_next": dict(sorted(outcomes.items())),
        # Per chat, each turn's positions its first stage took from cache / its prompt.
        "by_chat": [
            " ".join(f"{t.counts.reused_positions}/{t.prompt_tokens}" for t in chat)
            for chat in arm.chats
        ],
        "stats_unclear": sum(
            turn.counts.hits + turn.counts.misses != lookups for turn in everything
        ),
        "stats_missed": arm.stats_missed,
        "gap_ms_max": _ms(max((turn.gap_s for turn in nxt), default=0.0)),
        "errors": sum(bool(turn.error) or turn.ttft_s is None for turn in everything),
        "error_examples": sorted({turn.error for turn in everything if turn.error})[:5],
        "wall_s": round(arm.wall_s, 1),
    }


def wrong(on: SerialArm, off: SerialArm) -> int:
    """Turns whose text with reuse differs from the same chat's turn without."""
    return differing(on.chats, off.chats)


def reused_share(figures: Mapping[str, Any]) -> float | None:
    """The share of an arm's next turns that reused (None: it had none)."""
    total = figures["next_turns"]
    return round(figures["next_turns_reused"] / total, 4) if total else None


def verdict(shares: Sequence[float | None]) -> str:
    """Met when every round's on arm reused at least :data:`TARGET` of its next turns."""
    if not shares or any(s is None for s in shares):
        return "undecided"
    return "met" if all(s is not None and s >= TARGET for s in shares) else "not met"


def ratio(on: float | None, off: float | None) -> float | None:
    return round(on / off, 3) if on is not None and off else None


def serial_round(on: SerialArm, off: SerialArm) -> dict[str, Any]:
    """One round's figures for both arms, their ratios and the answers that differ."""
    a, b = serial_figures(on), serial_figures(off)
    return {
        "on": a,
        "off": b,
        "ttft_p50_ratio": ratio(a["ttft_p50_ms_next"], b["ttft_p50_ms_next"]),
        "ttft_max_ratio": ratio(a["ttft_max_ms_next"], b["ttft_max_ms_next"]),
        "reused_share": reused_share(a),
        "turns_that_differ": wrong(on, off),
    }


def summary(rounds: Sequence[Mapping[str, Any]], chats: int, turns: int) -> dict[str, Any]:
    shares = [r["reused_share"] for r in rounds]
    return {
        "chats": chats,
        "turns": turns,
        "rounds": list(rounds),
        "reused_shares": shares,
        "target": f"next turns (2..{turns}) reused with reuse on >= 15/16, every round",
        "verdict": verdict(shares),
    }


def failed(r: int, rnd: Mapping[str, Any]) -> list[str]:
    """Round ``r``'s failed checks: answers that differ, errors."""
    bad, on, off = rnd["turns_that_differ"], rnd["on"]["errors"], rnd["off"]["errors"]
    if not (bad or on or off):
        return []
    return [f"serial round {r + 1}: {bad} turns differ; {on} errors with reuse, {off} without"]
