"""Where the nodes say prompt prefixes are kept, followed from their news. Pure.

Each node hosting a model's first layers publishes what its prefix stores newly keep
and dropped (:class:`~hecate.wire.kept.PrefixNews`, numbered within the node's boot);
every router replica follows every node its plan names, so a chat's next turn finds
where its prefix is kept whichever replica takes it. A router that has not followed a
node from the start of its boot, or missed a news (the next one says so, or the node's
reminder of its last number when it is quiet), asks the node for the whole of it
(:class:`~hecate.wire.kept.PrefixState`) and holds the news heard meanwhile to play on
it, so what it holds of a node is what the node has told, in order. A node it is not
following is answered ``None`` (:meth:`KeptFollower.tokens`): the router's own guess
(:class:`hecate_router.affinity.PrefixIndex`) stands in.

Bounded: only nodes the plan names are followed, each model's prints held at most
:data:`~hecate.wire.kept.MAX_KEPT` a node (what a node tells at most), news held
meanwhile at most :data:`HOLD` a node.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from hecate.model.prints import Print
from hecate.wire.kept import MAX_KEPT, ModelNews, PrefixNews, PrefixState

#: News held per node while its whole state is asked for; past it, ask again after.
HOLD = 64


@dataclass(slots=True)
class _Followed:
    boot: str
    seq: int
    kept: dict[str, dict[bytes, int]] = field(default_factory=dict)  # by model, print
    prefill_ms: float | None = None  # what a prompt position costs a layer there

    def play(self, models: Iterable[ModelNews]) -> None:
        for m in models:
            kept = self.kept.setdefault(m.model_id, {})
            for p in m.dropped:
                kept.pop(p, None)
            for k in m.kept:
                if k.print in kept or len(kept) < MAX_KEPT:
                    kept[k.print] = k.tokens
            if not kept:
                del self.kept[m.model_id]


class KeptFollower:
    """What each followed node keeps, per model and print."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Followed] = {}
        self._asking: dict[str, list[PrefixNews]] = {}  # news heard while asked, by node
        self._named: frozenset[str] = frozenset()  # the nodes the plan names
        self.counters = {"news": 0, "asked": 0, "gaps": 0, "ignored": 0}

    def __len__(self) -> int:
        return len(self._nodes)

    def heard(self, news: PrefixNews) -> bool:
        """A node's news (its subject's node, checked by the caller): True when its
        whole state should be asked for now."""
        node_id = news.node_id
        if node_id not in self._named:
            self.counters["ignored"] += 1
            return False
        held = self._asking.get(node_id)
        if held is not None:
            if len(held) < HOLD:
                held.append(news)
            return False
        self.counters["news"] += 1
        node = self._nodes.get(node_id)
        if node is not None and node.boot == news.boot:
            if news.seq <= node.seq:
                return False  # heard already (a redelivery, or before the state asked)
            if news.seq == node.seq + 1 and not news.again:
                node.seq, node.prefill_ms = news.seq, news.prefill_ms
                node.play(news.models)
                return False
            self.counters["gaps"] += 1
        elif news.seq == 1 and not news.again:  # its first since it started: all there is
            node = self._nodes[node_id] = _Followed(news.boot, 1, prefill_ms=news.prefill_ms)
            node.play(news.models)
            return False
        return self._ask(node_id, [news])

    def told(self, node_id: str, state: PrefixState | None) -> bool:
        """The answer to asking ``node_id`` for its whole state (None: none came): True
        when it should be asked again (news held meanwhile do not follow on from it)."""
        held = self._asking.pop(node_id, None)
        if held is None or node_id not in self._named:
            return False
        if state is None or state.node_id != node_id:
            self._nodes.pop(node_id, None)  # unknown until it next says something
            return False
        node = self._nodes[node_id] = _Followed(state.boot, state.seq, prefill_ms=state.prefill_ms)
        node.play(state.models)
        for news in sorted(held, key=lambda n: n.seq):
            if news.boot != node.boot or news.seq <= node.seq:
                continue
            if news.seq != node.seq + 1 or news.again:
                return self._ask(node_id, [])
            node.seq, node.prefill_ms = news.seq, news.prefill_ms
            node.play(news.models)
        return len(held) >= HOLD and self._ask(node_id, [])  # some may have been missed

    def follow(self, node_ids: Collection[str]) -> list[str]:
        """The plan names ``node_ids`` (its pipelines' first nodes): stop following the
        others; those not followed yet are to be asked for their whole state now."""
        self._named = frozenset(node_ids)
        for gone in [n for n in self._nodes if n not in self._named]:
            del self._nodes[gone]
        for gone in [n for n in self._asking if n not in self._named]:
            del self._asking[gone]
        new = sorted(n for n in self._named if n not in self._nodes and n not in self._asking)
        for node_id in new:
            self._ask(node_id, [])
        return new

    def forget(self, node_id: str) -> None:
        """``node_id`` is down: what it kept is gone with it."""
        self._nodes.pop(node_id, None)

    def tokens(self, node_id: str, model_id: str, prints: list[Print]) -> int | None:
        """The tokens of the longest of ``prints`` ``node_id`` keeps of ``model_id``
        (0: none), or None when the node is not followed."""
        node = self._nodes.get(node_id)
        if node is None:
            return None
        kept = node.kept.get(model_id)
        if kept:
            for p, _share in reversed(prints):
                tokens = kept.get(p)
                if tokens is not None:
                    return tokens
        return 0

    def prefill_ms(self, node_id: str) -> float | None:
        """What a prompt position costs a layer on ``node_id``, as it last said."""
        node = self._nodes.get(node_id)
        return None if node is None else node.prefill_ms

    def status(self) -> dict[str, int]:
        return {
            **{f"kept_{k}": v for k, v in self.counters.items()},
            "kept_nodes": len(self._nodes),
            "kept_prints": sum(len(k) for n in self._nodes.values() for k in n.kept.values()),
        }

    def _ask(self, node_id: str, held: list[PrefixNews]) -> bool:
        self._asking[node_id] = held
        self.counters["asked"] += 1
        return True
