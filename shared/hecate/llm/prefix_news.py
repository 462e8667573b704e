"""What a first stage keeps, named as routers name prompts, and what it has told them.
Pure: no bus, no clock.

A first stage that runs a new prompt in a scope learns the prompt's text prints
(:func:`hecate.model.prints.text_prints`) with, for each, the last whole token block its
share of the prompt covers and that block's key in the stage's prefix store
(:mod:`hecate.llm.prefixes`). A print is *kept* once its block's key names a cache in the
store (the prompt has run that far), and while it does: :meth:`Announcer.news` says
which prints became kept (with the tokens of their whole blocks) and which of those
told stopped being (their cache freed, evicted or its session lost), since it was last
asked. What it knows is bounded
(:data:`hecate.model.prints.MAX_KEPT` prints a model, least recently learnt out first), and
so is what a router holds of it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from hecate.llm.prefixes import Prefixes
from hecate.model.prints import MAX_KEPT, KeptPrint, ModelNews, Print, print_tokens


@dataclass(frozen=True, slots=True)
class _Known:
    store: Prefixes
    scope: str
    key: bytes
    tokens: int


class Announcer:
    """Prints learnt per model, and what was told of them."""

    def __init__(self, most: int = MAX_KEPT) -> None:
        self.most = most
        self._known: dict[str, OrderedDict[bytes, _Known]] = {}
        self._told: dict[str, dict[bytes, int]] = {}
        self._learnt = False  # since the last news
        self._seen: tuple[tuple[int, int], ...] = ()  # the stores' versions then

    def learn(
        self,
        model_id: str,
        store: Prefixes,
        scope: str,
        prints: Sequence[Print],
        keys: Sequence[bytes],
        tokens: int,
    ) -> None:
        """A prompt of ``tokens`` tokens whose whole blocks' keys are ``keys`` runs in
        ``scope`` on the stage ``store`` is the prefix store of."""
        known = self._known.setdefault(model_id, OrderedDict())
        for print_, share in prints:
            j = print_tokens(share, tokens) // store.block - 1
            if not 0 <= j < len(keys):
                continue  # less than a block: nothing a later prompt could take
            was = known.get(print_)
            if was is None or not (was.store is store and store.holds(was.scope, was.key)):
                known[print_] = _Known(store, scope, keys[j], (j + 1) * store.block)
            known.move_to_end(print_)
            self._learnt = True
        while len(known) > self.most:
            known.popitem(last=False)

    def news(self, stores: Collection[Prefixes]) -> list[ModelNews]:
        """What became kept, and what told stopped being, since the last call; ``stores``
        are the prefix stores of the stages held now (a print learnt on a stage since
        let go is kept no more)."""
        seen = tuple(sorted((id(s), s.version) for s in stores))
        if not self._learnt and seen == self._seen:
            return []  # nothing learnt, no store changed: nothing to look at
        self._learnt, self._seen = False, seen
        live = {id(s) for s in stores}
        out: list[ModelNews] = []
        for model_id in sorted(self._known.keys() | self._told.keys()):
            known = self._known.get(model_id, OrderedDict())
            told = self._told.setdefault(model_id, {})
            kept: list[KeptPrint] = []
            for print_, k in list(known.items()):
                if id(k.store) not in live:
                    del known[print_]  # its stage is let go
                elif k.store.holds(k.scope, k.key):
                    if told.get(print_) != k.tokens:
                        told[print_] = k.tokens
                        kept.append(KeptPrint(print_, k.tokens))
                elif print_ in told:
                    del known[print_]  # kept, and no more
                # else: its positions are not computed yet (a prompt running in chunks)
            dropped = [p for p in told if p not in known]
            for p in dropped:
                del told[p]
            if kept or dropped:
                out.append(ModelNews(model_id=model_id, kept=kept, dropped=dropped))
            if not known and not told:
                self._known.pop(model_id, None)
                self._told.pop(model_id, None)
        return out

    def state(self) -> list[ModelNews]:
        """Everything told and not dropped since, by model."""
        return [
            ModelNews(model_id=m, kept=[KeptPrint(p, t) for p, t in told.items()])
            for m, told in sorted(self._told.items())
            if told
        ]
