"""Where this router sent each tenant's prompts lately, so that a prompt starting the same
way is costed lower on the pipelines whose nodes likely keep its prefix cached. Pure.

The nodes cache prompt prefixes by token blocks (:mod:`hecate.llm.prefixes`); the router
chooses before any node has tokenized the prompt, so it knows prompts by their text: a
chat by its messages (``fp_k`` names the first ``k`` messages), a plain prompt by whole
blocks of :data:`CHARS` characters, each chained within the tenant's scope as the nodes'
keys are. A pipeline that answered a prompt is remembered for each of its prefixes with
the tokens that prefix likely holds (its share of the prompt's characters, of the
prompt's tokens). The estimate can be wrong (another router replica sent the next turn
elsewhere; a node evicted it): the cost is then off by a token term, and the node says
``prefix_lost`` or simply finds less, never a wrong answer.

The saving is what the prefill a cached prefix spares would take, in the cost's own
units: its positions at what a prompt position was measured to cost on that pipeline
(the time to the first token of the prompts this router sent it with nothing known
cached, per position), so that an idle pipeline keeping a chat's prefix wins over an
idle one without it, and the load its last answer left in the nodes' figures does
not outweigh a second of prefill. The core shares the saving over the requests the
router has on the pipeline still (:meth:`hecate.core.router.Router.route`), so a burst
of prompts sharing a prefix spreads. Until a rate is measured, the seed's own token
term (``w_p·10·tokens/1024``) stands in.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from collections.abc import Collection, Sequence
from typing import Literal

from hecate.wire.messages import InferRequest

#: Where a prompt went, as to the prefix it was known to have kept: toward a pipeline
#: keeping some of it, nowhere known to keep any, or elsewhere.
Outcome = Literal["toward", "none", "elsewhere"]
#: Why elsewhere: the pipelines keeping it were at their admission limit, or cost more
#: (load, latency, health) than the saving made up for.
Elsewhere = Literal["full", "cost"]

#: Characters per block of a plain prompt's fingerprint.
CHARS = 256
#: The shortest prompt whose time to its first token measures a position's cost, and
#: the weight each new measure gets.
RATE_POSITIONS = 64
RATE_WEIGHT = 0.3
#: (fingerprint, pipeline) pairs remembered, least recently served first out.
REMEMBER = 65_536


def fingerprints(request: InferRequest) -> list[tuple[bytes, float]]:
    """The request's prefixes, each as its key and its share of the prompt's characters."""
    h = hashlib.blake2b(request.tenant.encode(), digest_size=16, person=b"hecate-route")
    seed = h.digest()
    out: list[tuple[bytes, float]] = []
    if request.messages:
        parts: Sequence[str] = [f"{m.role}\0{m.content}" for m in request.messages]
        total = sum(len(p) for p in parts)
    else:
        text = request.prompt
        parts = [text[i : i + CHARS] for i in range(0, len(text) - CHARS + 1, CHARS)]
        total = len(text)
    total = max(total, 1)
    seen = 0
    for part in parts:
        seed = hashlib.blake2b(seed + part.encode(), digest_size=16).digest()
        seen += len(part)
        out.append((seed, seen / total))
    return out


class PrefixIndex:
    """Per prefix of a tenant's prompts, the pipelines that answered it and the tokens
    it held there; and per pipeline what a prompt position costs there (:meth:`saves`)."""

    def __init__(self, remember: int = REMEMBER) -> None:
        self.remember = remember
        self._at: OrderedDict[tuple[bytes, str], int] = OrderedDict()
        self._where: dict[bytes, set[str]] = {}
        self.rates: dict[str, float] = {}  # ms per prompt position, by pipeline (EWMA)

    def prefilled(self, pipeline_id: str, positions: int, seconds: float) -> None:
        """A prompt of ``positions`` positions, none known cached, took ``seconds`` to its
        first token on ``pipeline_id`` (its first route): what a position costs there,
        as the caller waits for it (the bus, the queue and the compute together)."""
        if positions < RATE_POSITIONS or seconds <= 0:
            return  # a short prompt's time is its round trips, not its positions
        rate = 1000 * seconds / positions
        was = self.rates.get(pipeline_id)
        self.rates[pipeline_id] = rate if was is None else was + RATE_WEIGHT * (rate - was)

    def saves(self, cached: dict[str, int]) -> dict[str, float]:
        """What each pipeline's cached tokens spare, in milliseconds at its measured rate
        (a pipeline never measured: at the slowest rate measured, if any; none known,
        none: the cost model's token term stands in)."""
        if not self.rates:
            return {}
        slowest = max(self.rates.values())
        return {pid: tokens * self.rates.get(pid, slowest) for pid, tokens in cached.items()}

    def __len__(self) -> int:
        return len(self._at)

    def cached(self, prints: list[tuple[bytes, float]]) -> dict[str, int]:
        """Per pipeline, the tokens of the longest of ``prints`` it answered."""
        out: dict[str, int] = {}
        for key, _share in reversed(prints):
            for pid in self._where.get(key, ()):
                if pid not in out:
                    out[pid] = self._at[(key, pid)]
        return out

    def served(self, prints: list[tuple[bytes, float]], pipeline_id: str, tokens: int) -> None:
        """``pipeline_id`` answered a prompt of ``tokens`` tokens whose prefixes are
        ``prints``: its nodes now likely keep the whole blocks of each."""
        for key, share in prints:
            pair = (key, pipeline_id)
            self._at[pair] = int(tokens * share)
            self._at.move_to_end(pair)
            self._where.setdefault(key, set()).add(pipeline_id)
        while len(self._at) > self.remember:
            (key, pid), _ = self._at.popitem(last=False)
            where = self._where.get(key)
            if where is not None:
                where.discard(pid)
                if not where:
                    del self._where[key]


def outcome(
    cached: dict[str, int], chosen: str, full: Collection[str]
) -> tuple[Outcome, Elsewhere | None]:
    """Where a prompt keeping ``cached`` (tokens per pipeline) went, routed to
    ``chosen`` with the pipelines ``full`` at their limit, and why if elsewhere."""
    if not cached:
        return "none", None
    if chosen in cached:
        return "toward", None
    return "elsewhere", "full" if all(pid in full for pid in cached) else "cost"


def routed(
    counters: Counter[str], cached: dict[str, int], chosen: str, full: Collection[str]
) -> Outcome:
    """:func:`outcome`, counted (``prefix_toward``, ``prefix_none``, ``prefix_elsewhere``
    and, of those, ``prefix_elsewhere_full`` or ``prefix_elsewhere_cost``)."""
    went, why = outcome(cached, chosen, full)
    counters[f"prefix_{went}"] += 1
    if why is not None:
        counters[f"prefix_elsewhere_{why}"] += 1
    return went
