"""A prompt's prefixes named by its text, as routers and first stages both name them. Pure.

A router chooses a pipeline before any node has tokenized the prompt, so the prefixes
it asks about are named by text: a chat by its messages (print ``k`` names the first
``k + 1`` messages), a plain prompt by whole blocks of :data:`CHARS` characters, each
key chained from the one before within the tenant's scope, as the nodes' token-block
keys are (:mod:`hecate.llm.prefixes`). A first stage, which tokenizes the prompt,
names the same prints with the tokens each likely holds (its share of the prompt's
characters, of the prompt's tokens) when it tells routers what it keeps
(:mod:`hecate.llm.prefix_news`, in :class:`ModelNews`); two prompts share a print
exactly when they share a scope and that text (up to a 128-bit collision).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Annotated

import msgspec

#: Characters per block of a plain prompt's prints.
CHARS = 256
#: Bytes of a print.
PRINT_BYTES = 16

#: Prints a first stage tells at most, per model: what a router holds of a node is
#: bounded by it, and so is one news (a stage that keeps more drops its least recent).
MAX_KEPT = 4096

#: A prefix's print and its share of the prompt's characters (0 < share <= 1).
Print = tuple[bytes, float]

PrintBytes = Annotated[bytes, msgspec.Meta(min_length=PRINT_BYTES, max_length=PRINT_BYTES)]
Tokens = Annotated[int, msgspec.Meta(ge=0, le=1 << 24)]
Slug = Annotated[str, msgspec.Meta(pattern="^[a-z0-9][a-z0-9_-]{0,63}$")]


class KeptPrint(msgspec.Struct, frozen=True, array_like=True):
    """A prefix a first stage keeps (its print) and the tokens of it kept."""

    print: PrintBytes
    tokens: Tokens


class ModelNews(msgspec.Struct, frozen=True, kw_only=True):
    """One model's prefixes newly kept (or kept with more tokens) and dropped, as an
    executor says (:meth:`hecate.llm.executor.LlmExecutor.prefix_news`) and the node
    tells routers (:mod:`hecate.wire.kept`)."""

    model_id: Slug
    kept: Annotated[list[KeptPrint], msgspec.Meta(max_length=MAX_KEPT)] = []
    dropped: Annotated[list[PrintBytes], msgspec.Meta(max_length=MAX_KEPT)] = []


def text_prints(scope: str, messages: Sequence[tuple[str, str]] | None, prompt: str) -> list[Print]:
    """The prints of a prompt in ``scope`` (the tenant): one a message of a chat
    (``messages`` as (role, content) pairs), else one a whole block of ``prompt``."""
    seed = hashlib.blake2b(scope.encode(), digest_size=PRINT_BYTES, person=b"hecate-route")
    key = seed.digest()
    parts: Sequence[str]
    if messages:
        parts = [f"{role}\0{content}" for role, content in messages]
        total = sum(len(p) for p in parts)
    else:
        parts = [prompt[i : i + CHARS] for i in range(0, len(prompt) - CHARS + 1, CHARS)]
        total = len(prompt)
    total = max(total, 1)
    out: list[Print] = []
    seen = 0
    for part in parts:
        key = hashlib.blake2b(key + part.encode(), digest_size=PRINT_BYTES).digest()
        seen += len(part)
        out.append((key, seen / total))
    return out


def print_tokens(share: float, tokens: int) -> int:
    """The tokens a prefix of ``share`` of a prompt of ``tokens`` tokens likely holds."""
    return int(tokens * share)
