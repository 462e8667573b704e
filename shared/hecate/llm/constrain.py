"""Constrained sampling and log-probabilities, on the stage that samples.

A generation whose text must have a shape (``OutputFormat``: any JSON object, JSON valid
against a schema, or text of a Lark grammar, as tool calls ask) is sampled only among
the tokens that keep its text on the way to a valid answer: llguidance compiles the
shape into a grammar over the model's own
tokens and, at each step, says which tokens may come next (a bit per token of the
vocabulary); the others' logits are set to minus infinity before sampling. Once the
answer is whole, only the model's end tokens may come.

The state of a constraint is the tokens sampled so far, which every step carries
(``StepInput.sampled``): a node keeps the matcher of each session it samples for and
advances it by the tokens it has not seen yet, and a node that never saw the session (a
rescue route after a failover) rebuilds it from them, so a rescued generation is
constrained exactly as it was on its first route. A sample the router discards (on a
prompt chunk that was not the last) never advances it.

The grammar library was picked by what a node pays per token: llguidance computes a mask
lazily against a token trie (0.02 ms a step for JSON on SmolLM2's 49,152 tokens, against
0.5 ms for outlines-core to list a step's allowed tokens: ``hecate bench constrain``),
needs nothing but numpy here, and checks a schema without a tokenizer, so the gateway
refuses a bad one up front. xgrammar needs torch.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

import llguidance
import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer

from hecate.model.executor import Candidate, OutputFormat, TokenLogprob

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

__all__ = ["ConstraintError", "Constraints", "grammar_of", "logprob_of", "refusal"]

#: Sessions whose matcher a node keeps (least recently used beyond it are rebuilt from
#: their tokens if they step again).
MATCHERS = 1024
#: A compact JSON answer: no whitespace between its tokens (a model left free to emit
#: whitespace can emit it for ever and never close the object).
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}
ANY_OBJECT = '{"type": "object"}'


class ConstraintError(ValueError):
    """A shape the grammar library refuses, or a session whose tokens break it."""


def grammar_of(shape: OutputFormat) -> str:
    """The llguidance grammar of ``shape``. Raises :class:`ConstraintError` naming
    what is wrong (the schema is not JSON, or not a schema llguidance can follow)."""
    return _grammar(shape.type, shape.schema, shape.grammar)


@lru_cache(maxsize=256)
def _grammar(kind: str, schema: str, lark: str) -> str:
    if kind == "lark":
        return _checked(llguidance.LLMatcher.grammar_from_lark(lark))
    text = ANY_OBJECT if kind == "json_object" else schema
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConstraintError(f"the schema is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise ConstraintError("the schema must be a JSON object")
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(parsed, overrides=JSON_OPTIONS)
    except ValueError as exc:
        raise ConstraintError(str(exc)) from None
    return _checked(grammar)


def _checked(grammar: str) -> str:
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise ConstraintError(error)
    return grammar


def refusal(shape: OutputFormat) -> str | None:
    """Why ``shape`` cannot be followed, or None: what a gateway checks up front."""
    try:
        grammar_of(shape)
    except ConstraintError as exc:
        return str(exc)
    return None


@dataclass
class _Held:
    grammar: str
    matcher: llguidance.LLMatcher
    seen: list[int] = field(default_factory=list)


class Constraints:
    """One executor's constraints: the model's tokens as llguidance sees them (made
    once, when first needed), and the matcher of each session it samples for."""

    def __init__(self, tokenizer: Tokenizer, eos: Sequence[int], vocab: int) -> None:
        """``vocab``: the width of the logits (it may exceed the tokenizer's)."""
        self._hf = tokenizer
        self._eos = sorted(eos)
        self.vocab = vocab
        self._llt: llguidance.LLTokenizer | None = None
        self._held: OrderedDict[str, _Held] = OrderedDict()
        self._pieces: list[bytes] | None = None

    def tokens(self) -> llguidance.LLTokenizer:
        if self._llt is None:
            self._llt = llguidance.LLTokenizer(
                self._hf.to_str(), n_vocab=self.vocab, eos_token=self._eos or None
            )
        return self._llt

    def piece(self, token: int) -> bytes:
        """``token``'s own bytes (part of a character, perhaps)."""
        if self._pieces is None:
            llt = self.tokens()
            self._pieces = [llt.decode_bytes([i]) for i in range(self.vocab)]
        return self._pieces[token]

    def allowed(
        self, session: str, shape: OutputFormat, sampled: Sequence[int]
    ) -> npt.NDArray[np.bool_]:
        """Which tokens may come after ``sampled`` under ``shape`` (one bool per logit).
        Raises :class:`ConstraintError` when ``sampled`` itself breaks the shape."""
        grammar = grammar_of(shape)
        held = self._held.pop(session, None)
        if held is None or held.grammar != grammar or held.seen != list(sampled[: len(held.seen)]):
            held = _Held(grammar, llguidance.LLMatcher(self.tokens(), grammar, log_level=0))
        new = list(sampled[len(held.seen) :])
        if new and not held.matcher.consume_tokens(new):
            raise ConstraintError(
                f"the tokens sampled so far break the answer's shape: "
                f"{held.matcher.get_error() or 'token refused'}"
            )
        held.seen.extend(new)
        if held.matcher.is_error():
            raise ConstraintError(held.matcher.get_error())
        self._held[session] = held
        while len(self._held) > MATCHERS:
            self._held.popitem(last=False)
        mask = np.frombuffer(held.matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(mask, bitorder="little")[: self.vocab].astype(bool)

    def forget(self, session: str) -> None:
        self._held.pop(session, None)


def logprob_of(
    logits: npt.NDArray[np.float32], token: int, top: int, piece: Callable[[int], bytes]
) -> TokenLogprob:
    """``token``'s log-probability under ``logits`` (the model's own distribution, at
    temperature 1), with the ``top`` most likely tokens, most likely first."""
    z = logits.astype(np.float64)
    z = z - z.max()
    lse = float(np.log(np.exp(z).sum()))
    best: list[Candidate] = []
    if top > 0:
        idx = np.argpartition(-z, top - 1)[:top]
        idx = idx[np.argsort(-z[idx], kind="stable")]
        best = [Candidate(int(i), piece(int(i)), float(z[i]) - lse) for i in idx]
    return TokenLogprob(token, piece(token), float(z[token]) - lse, best)
