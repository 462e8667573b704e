"""Prompt prefixes a stage keeps the KV cache of, so that a prompt starting the same way
computes only the rest. Pure: no model, no clock.

A prompt's tokens are cut into blocks of :data:`BLOCK`; block ``j``'s *key* names the
prompt's first ``(j + 1) * BLOCK`` tokens within a *scope*, the tenant the bus vouched
for: ``key_j = blake2b(key_{j-1} || block_j)``, ``key_{-1}`` the scope's own. Two
prompts share a key exactly when they share a scope and those tokens (up to a 128-bit
collision), so a prefix kept for one tenant is never found for another: a different
scope gives different keys, and the store checks the scope of what it finds besides.

What is kept is a session's own cache, not a copy: once a prompt's positions are
computed its blocks' keys name that cache (a session never rewrites positions it
holds), and a session that ends hands its cache to the store instead of freeing it
while a key still names it. A new session that finds a prefix copies those positions
into its own cache (:meth:`Prefixes.longest`, then the stage's ``copy_prefix``).
The store is bounded in caches kept for it alone (``max_kept``, least recently used
first out); a stage short of room takes those back before it refuses a session.
"""

from __future__ import annotations

import functools
import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

#: Tokens per block: a prefix is reused in whole blocks.
BLOCK = 32
#: Caches kept for their prefixes alone (their sessions ended), per stage.
MAX_KEPT = 16


def block_keys(scope: str, tokens: Sequence[int], block: int = BLOCK) -> list[bytes]:
    """The keys of ``tokens``' whole blocks in ``scope``: ``keys[j]`` names the first
    ``(j + 1) * block`` tokens."""
    seed = hashlib.blake2b(scope.encode(), digest_size=16, person=b"hecate-prefix").digest()
    keys: list[bytes] = []
    for start in range(0, len(tokens) - block + 1, block):
        h = hashlib.blake2b(keys[-1] if keys else seed, digest_size=16)
        h.update(array("q", tokens[start : start + block]).tobytes())
        keys.append(h.digest())
    return keys


class PrefixArgs(TypedDict):
    """A step's ``scope`` and ``keys`` (:class:`hecate.llm.sessions.Step`)."""

    scope: str | None
    keys: tuple[bytes, ...]


def prefix_of(scope: str | None, prompt: Sequence[int] | None) -> PrefixArgs:
    """The scope and block keys a step names its prompt's cached prefix by (none
    without a scope or the prompt's tokens)."""
    if scope is None or not prompt:
        return {"scope": None, "keys": ()}
    return {"scope": scope, "keys": _keys(scope, tuple(prompt))}


@functools.lru_cache(maxsize=256)
def _keys(scope: str, prompt: tuple[int, ...]) -> tuple[bytes, ...]:
    """The same prompt's every chunk, on every stage of a node, asks for its keys."""
    return tuple(block_keys(scope, prompt))


@dataclass(eq=False)
class Kept:
    """A cache whose first positions are named by ``keys`` (block ``j``: ``keys[j]``),
    within ``scope``; ``named``: how many of those keys still name it (a later cache of
    the same prompt takes them); ``live`` while its session still steps."""

    cache: Any
    scope: str
    keys: list[bytes] = field(default_factory=list)
    named: int = 0
    live: bool = True


class Prefixes:
    """The keys a stage's caches are known by, and the caches kept for them alone."""

    def __init__(self, *, block: int = BLOCK, max_kept: int = MAX_KEPT) -> None:
        self.block = block
        self.max_kept = max_kept
        self._by_key: dict[bytes, Kept] = {}
        self._of: OrderedDict[int, Kept] = OrderedDict()  # by id(cache), least recent first
        self._changed = False  # since the last overflow: a cache kept alone, or unnamed
        self.version = 0  # one more at each change of what the keys name
        self.hits = 0
        self.misses = 0
        self.reused_positions = 0

    def __len__(self) -> int:
        return len(self._of)

    def kept_alone(self) -> int:
        """Caches kept for their prefixes whose sessions ended."""
        return sum(not k.live for k in list(self._of.values()))

    def counts(self) -> dict[str, int]:
        """Sessions started from a cached prefix here (``hits``), first-stage prompts
        that found none (``misses``), positions taken from cache, caches kept for
        prefixes and those of them kept alone."""
        return {
            "hits": self.hits,
            "misses": self.misses,
            "reused_positions": self.reused_positions,
            "kept": len(self._of),
            "kept_alone": self.kept_alone(),
        }

    def kept_bytes(self) -> int:
        """What the caches kept alone hold."""
        return sum(k.cache.nbytes() for k in self._of.values() if not k.live)

    def longest(self, scope: str, keys: Sequence[bytes], limit: int) -> int:
        """How many positions of the prompt whose ``keys`` are given the longest prefix
        kept in ``scope`` holds, at most ``limit`` (0: none, counted as a miss)."""
        for j in range(min(len(keys), limit // self.block) - 1, -1, -1):
            if self.find(scope, keys[j]) is not None:
                return (j + 1) * self.block
        self.misses += 1
        return 0

    def took(self, length: int) -> None:
        """A new session started from ``length`` cached positions (a hit)."""
        self.hits += 1
        self.reused_positions += length

    def find(self, scope: str, key: bytes) -> Any | None:
        """The cache ``key`` names in ``scope``, if kept (it holds at least the positions
        the key stands for: caches never shrink)."""
        kept = self._by_key.get(key)
        if kept is None or kept.scope != scope:
            return None
        self._of.move_to_end(id(kept.cache))
        return kept.cache

    def holds(self, scope: str, key: bytes) -> bool:
        """Whether ``key`` names a cache in ``scope`` (a look that changes nothing: not
        a use, as :meth:`find` is)."""
        kept = self._by_key.get(key)
        return kept is not None and kept.scope == scope

    def name(self, scope: str, keys: Sequence[bytes], cache: Any, length: int) -> None:
        """``cache`` holds its prompt's first ``length`` positions: the whole blocks among
        them are known by their ``keys`` from now on (a key already naming another cache
        moves to this one, the more recent)."""
        whole = min(len(keys), length // self.block)
        kept = self._of.get(id(cache))
        if whole == 0 or (kept is not None and (kept.scope != scope or whole <= len(kept.keys))):
            return  # nothing new (a cache serves one scope for its life)
        if kept is None:
            kept = self._of[id(cache)] = Kept(cache, scope)
        self._of.move_to_end(id(cache))
        self.version += 1
        for key in keys[len(kept.keys) : whole]:
            before = self._by_key.get(key)
            if before is not None:
                before.named -= 1
                self._changed = self._changed or (before.named == 0 and not before.live)
            self._by_key[key] = kept
            kept.named += 1
        kept.keys = list(keys[:whole])

    def ended(self, cache: Any) -> bool:
        """``cache``'s session ended: True when the store keeps the cache (its owner now,
        which frees it when it lets it go), False when the caller should free it."""
        kept = self._of.get(id(cache))
        if kept is None or kept.named == 0:
            self._of.pop(id(cache), None)
            return False
        kept.live = False
        self._changed = True
        return True

    def overflow(self) -> list[Any]:
        """Caches to free now: those kept alone past ``max_kept`` and those no key names
        any more, least recently used first (none to look for when nothing changed)."""
        if not self._changed:
            return []
        self._changed = False
        out = [self._forget(i) for i, k in list(self._of.items()) if not k.live and not k.named]
        alone = [ident for ident, kept in self._of.items() if not kept.live]
        out += [self._forget(ident) for ident in alone[: max(0, len(alone) - self.max_kept)]]
        return out

    def give_up_one(self, but: Any = None) -> Any | None:
        """The least recently used cache kept alone (other than ``but``), let go: its
        stage needs room. None when there is none."""
        ident = next((i for i, k in self._of.items() if not k.live and k.cache is not but), None)
        return None if ident is None else self._forget(ident)

    def drop(self, cache: Any) -> None:
        """Forget ``cache`` (its session was dropped as lost: trust none of it)."""
        if id(cache) in self._of:
            self._forget(id(cache))

    def _forget(self, ident: int) -> Any:
        kept = self._of.pop(ident)
        self.version += 1
        for key in kept.keys:
            if self._by_key.get(key) is kept:
                del self._by_key[key]
        return kept.cache
