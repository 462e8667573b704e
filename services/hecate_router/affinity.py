"""Where each tenant's prompt prefixes are kept, so that a prompt starting the same way
is costed lower on the pipelines whose nodes keep its prefix cached. Pure.

The nodes cache prompt prefixes by token blocks (:mod:`hecate.llm.prefixes`); the router
chooses before any node has tokenized the prompt, so it knows prompts by their text
prints (:mod:`hecate.model.prints`: a chat by its messages, a plain prompt by whole
blocks of :data:`CHARS` characters, chained within the tenant's scope). A pipeline's
first node says which prints its stores keep, and with how many tokens
(:mod:`hecate_router.kept`, followed by every router replica): what it says is what
the pipeline is costed by. For a first node not followed (not yet, or it says nothing)
the router's own guess stands in: a pipeline that answered a prompt is remembered for
each of its prefixes with the tokens that prefix likely holds (its share of the
prompt's characters, of the prompt's tokens). Either can be wrong for a moment (a later
stage evicted it, a news is on its way): the node then says ``prefix_lost`` or simply
finds less, never a wrong answer.

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

from collections import Counter, OrderedDict
from collections.abc import Collection, Mapping
from typing import Literal

from hecate.model.prints import CHARS, Print, text_prints
from hecate.wire.messages import InferRequest
from hecate_router.kept import KeptFollower

__all__ = ["CHARS", "Outcome", "PrefixIndex", "fingerprints", "kept_at", "outcome", "routed"]

#: Where a prompt went, as to the prefix it was known to have kept: toward a pipeline
#: keeping some of it, nowhere known to keep any, or elsewhere.
Outcome = Literal["toward", "none", "elsewhere"]
#: Why elsewhere: the pipelines keeping it were at their admission limit, or cost more
#: (load, latency, health) than the saving made up for.
Elsewhere = Literal["full", "cost"]

#: The shortest prompt whose time to its first token measures a position's cost, and
#: the weight each new measure gets.
RATE_POSITIONS = 64
RATE_WEIGHT = 0.3
#: (fingerprint, pipeline) pairs remembered, least recently served first out.
REMEMBER = 65_536


def fingerprints(request: InferRequest) -> list[Print]:
    """The request's prefixes, each as its print and its share of the prompt's characters
    (:func:`hecate.model.prints.text_prints`, as the first stages name them)."""
    messages = [(m.role, m.content) for m in request.messages] if request.messages else None
    return text_prints(request.tenant, messages, request.prompt)


class PrefixIndex:
    """Per prefix of a tenant's prompts, the pipelines that answered it and the tokens
    it held there; and per pipeline what a prompt position costs there (:meth:`saves`)."""

    def __init__(self, remember: int = REMEMBER) -> None:
        self.kept = KeptFollower()  # where the nodes say they keep them
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

    def saves(
        self, cached: dict[str, int], estimates: Mapping[str, float] | None = None
    ) -> dict[str, float]:
        """What each pipeline's cached tokens spare, in milliseconds at its measured rate;
        a pipeline never measured, at its ``estimates`` (ms a position, as its nodes say
        they compute one), else at the slowest rate measured; none of either known,
        none: the cost model's token term stands in."""
        estimates = estimates or {}
        slowest = max(self.rates.values(), default=None)
        out: dict[str, float] = {}
        for pid, tokens in cached.items():
            rate = self.rates.get(pid, estimates.get(pid, slowest))
            if rate is not None:
                out[pid] = tokens * rate
        return out

    def __len__(self) -> int:
        return len(self._at)

    def where(
        self, prints: list[Print], model_id: str, firsts: Mapping[str, str], layers: int
    ) -> tuple[dict[str, int], dict[str, float]]:
        """Per pipeline (``firsts``: each one's first node) of a model of ``layers``
        layers, the tokens of ``prints`` kept there (:func:`kept_at`) and what they spare
        (:meth:`saves`; until this router has timed a pipeline, at what its first node
        says a position costs a layer, over every layer)."""
        cached = kept_at(prints, model_id, firsts, self.kept, self)
        estimates = {
            pid: per * layers
            for pid in cached
            if (node := firsts.get(pid)) is not None
            and (per := self.kept.prefill_ms(node)) is not None
        }
        return cached, self.saves(cached, estimates)

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


def kept_at(
    prints: list[Print],
    model_id: str,
    firsts: Mapping[str, str],
    kept: KeptFollower,
    guess: PrefixIndex,
) -> dict[str, int]:
    """Per pipeline (``firsts``: each one's first node), the tokens of the longest of
    ``prints`` kept there: as its first node has said (``kept``), else, for a node not
    followed, as this router guesses from where it sent prompts (``guess``)."""
    if not prints:
        return {}
    guessed = guess.cached(prints)
    out = {pid: tokens for pid, tokens in guessed.items() if pid not in firsts}
    for pid, node_id in firsts.items():
        tokens = kept.tokens(node_id, model_id, prints)
        if tokens is None:
            tokens = guessed.get(pid, 0)
        if tokens:
            out[pid] = tokens
    return out


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
