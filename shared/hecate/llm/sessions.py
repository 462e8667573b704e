"""A node's share of generation: its stage of the model, and one KV cache per session.

A session is one generation (one attempt of one request). Each step brings the next
positions: token ids on the first stage, the previous stage's hidden state on the
others. ``position`` says how many positions the caller believes this stage already
holds; a mismatch (a cache evicted, a node restarted) is an explicit ``session_lost``,
never a silently wrong continuation: the router then replays the whole sequence.
Steps of several sessions run as one batch (``step_batch``): each is checked on its own
first, so one lost session fails only its own step. Caches are bounded in total bytes
and dropped after ``idle_s`` without a step.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from hecate.llm.gguf_model import LlamaConfig
from hecate.llm.llama import Array
from hecate.llm.prefixes import Prefixes
from hecate.model.executor import ExecutorError


class Cache(Protocol):
    """One session's keys and values on a stage."""

    @property
    def length(self) -> int: ...

    def nbytes(self) -> int: ...


class Stage(Protocol):
    """What runs a layer range: the numpy model (:class:`hecate.llm.llama.LlamaStage`)
    or the engine (:class:`hecate.llm.onnx_stage.OnnxStage`)."""

    config: LlamaConfig
    first: bool
    last: bool

    @property
    def block_count(self) -> int: ...

    def new_cache(self) -> Any: ...

    def free(self, cache: Any) -> None: ...

    def copy_prefix(self, source: Any, cache: Any, length: int) -> None:
        """Make ``cache`` (new, empty) hold ``source``'s first ``length`` positions."""
        ...

    def embed(self, tokens: list[int]) -> Array: ...

    def forward_batch(self, xs: list[Array], caches: list[Any]) -> list[Array]: ...

    def logits_of(self, outs: list[Array]) -> Array: ...


#: How many full-context sessions a stage's caches may hold before the least recently
#: used is dropped: a few long prompts at once must fit, or each would evict the other
#: mid-prefill and replay forever.
FULL_CONTEXT_SESSIONS = 4


#: the bytes of a KV number where a stage does not say (:func:`kv_itemsize`): float32
FLOAT32_BYTES = 4


def kv_bytes_per_position(config: LlamaConfig, blocks: int, itemsize: int = FLOAT32_BYTES) -> int:
    """Keys and values of one position over ``blocks`` blocks, each number of
    ``itemsize`` bytes (a stage's: :func:`kv_itemsize`)."""
    return 2 * blocks * config.kv_heads * config.head_dim * itemsize


def kv_itemsize(stage: Stage) -> int:
    """The bytes of a number of ``stage``'s KV cache: its ``kv_itemsize`` (the engine's
    float16: 2), else float32's 4 (the numpy model's)."""
    size: int = getattr(stage, "kv_itemsize", FLOAT32_BYTES)
    return size


def default_max_bytes(stage: Stage) -> int:
    """Room for :data:`FULL_CONTEXT_SESSIONS` sessions of the whole context on this stage
    (SmolLM2, 10 blocks, float16: 7,680 bytes a position, 63 MB a full session, 252 MB
    in all; float32 twice that; shorter sessions, the usual case, take only what they
    use)."""
    per_position = kv_bytes_per_position(stage.config, stage.block_count, kv_itemsize(stage))
    return FULL_CONTEXT_SESSIONS * stage.config.context * per_position


@dataclass(frozen=True)
class Step:
    """The next positions of one session: token ids (first stage) or hidden bytes.
    ``one_by_one``: run them a position at a time, each as a decode step (a replay's
    sampled tokens, computed as they were when sampled)."""

    session: str
    position: int
    tokens: list[int] | None = None
    hidden: bytes = b""
    one_by_one: bool = False
    # Prefix reuse (:mod:`hecate.llm.prefixes`): the tenant's scope (None: none), the
    # keys of the prompt's whole blocks, and how many positions a new session starts
    # with, copied from the cached prefix they name (its rows then follow them).
    scope: str | None = None
    keys: tuple[bytes, ...] = ()
    reuse: int = 0

    def rows(self, width: int) -> int:
        """The positions this step runs: its tokens, or its hidden rows of ``width``."""
        return len(self.tokens) if self.tokens is not None else len(self.hidden) // (4 * width)

    def positions(self, width: int) -> list[Step]:
        """This step as one step a position (``width``: the hidden rows' width)."""
        start = self.position + self.reuse
        if self.tokens is not None:
            return [Step(self.session, start + k, tokens=[t]) for k, t in enumerate(self.tokens)]
        row = 4 * width
        return [
            Step(self.session, start + k, hidden=self.hidden[k * row : (k + 1) * row])
            for k in range(self.rows(width))
        ]


class Sessions:
    def __init__(
        self,
        stage: Stage,
        *,
        max_bytes: int | None = None,
        idle_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stage = stage
        self.max_bytes = default_max_bytes(stage) if max_bytes is None else max_bytes
        self.idle_s = idle_s
        self.clock = clock
        self.caches: OrderedDict[str, tuple[Any, float]] = OrderedDict()
        self.prefixes = Prefixes()

    def step(
        self,
        session: str,
        position: int,
        *,
        tokens: list[int] | None = None,
        hidden: bytes = b"",
    ) -> Array:
        """Run the next positions of ``session``; returns this stage's output hidden.

        Raises :class:`ExecutorError` (``session_lost``, ``bad_activation``)."""
        out = self.step_batch([Step(session, position, tokens, hidden)])[0]
        if isinstance(out, ExecutorError):
            raise out
        return out

    def step_batch(self, steps: list[Step]) -> list[Array | ExecutorError]:
        """Run the next positions of several sessions in one forward pass per round;
        returns, per step and in order, this stage's output hidden or why that step was
        refused. A session named twice runs its steps in order, one round each (its
        second step expects the positions its first adds). A ``one_by_one`` step runs
        as that many steps of one position, in rounds beside the others' steps; its
        output is their rows (on the last stage, the last position's)."""
        width = self.stage.config.hidden
        parts: list[tuple[int, Step]] = []  # (the step it is part of, what runs)
        for i, step in enumerate(steps):
            if step.one_by_one:
                parts.extend((i, one) for one in step.positions(width))
            else:
                parts.append((i, step))
        results: list[Array | ExecutorError | None] = [None] * len(parts)
        todo = list(range(len(parts)))
        while todo:
            seen: set[str] = set()
            now: list[int] = []
            later: list[int] = []
            for j in todo:
                (later if parts[j][1].session in seen else now).append(j)
                seen.add(parts[j][1].session)
            self._round([(j, parts[j][1]) for j in now], results)
            todo = later
        merged: list[list[Array | ExecutorError | None]] = [[] for _ in steps]
        for (i, _), result in zip(parts, results, strict=True):
            merged[i].append(result)
        return [self._merge(outs) for outs in merged]

    def _merge(self, outs: list[Array | ExecutorError | None]) -> Array | ExecutorError:
        """One step's output from its parts': the first refusal, or the rows."""
        rows: list[Array] = []
        for out in outs:
            if out is None:
                return ExecutorError("internal", "step not run")
            if isinstance(out, ExecutorError):
                return out
            rows.append(out)
        if len(rows) == 1 or self.stage.last:
            return rows[-1]  # the last stage answers for the last position only
        return np.concatenate(rows)

    def _round(
        self, steps: list[tuple[int, Step]], results: list[Array | ExecutorError | None]
    ) -> None:
        now = self.clock()
        keep = {s.session for _, s in steps}  # never evicted for another: they step now
        self._evict(now, keep=keep)
        ready: list[tuple[int, Step, Any, Array]] = []
        for i, step in steps:
            try:
                x = self._input(step)
                cache = self._cache(step, keep)
                ready.append((i, step, cache, x))
            except ExecutorError as exc:
                results[i] = exc
        if not ready:
            return
        outs = self.stage.forward_batch([x for *_, x in ready], [c for _, _, c, _ in ready])
        for (i, step, cache, _), out in zip(ready, outs, strict=True):
            self.caches[step.session] = (cache, now)
            self.caches.move_to_end(step.session)
            if step.scope is not None and step.keys:
                self.prefixes.name(step.scope, step.keys, cache, cache.length)
            results[i] = out
        for cache in self.prefixes.overflow():
            self.stage.free(cache)

    def _cache(self, step: Step, keep: Collection[str]) -> Any:
        session, position = step.session, step.position
        held = self.caches.get(session)
        if held is None and position == 0:
            if step.reuse:
                return self._adopt(step, keep)
            return self._new_cache(keep)
        if held is not None and held[0].length == position:
            return held[0]
        have = held[0].length if held else 0
        self._drop(session, lost=True)
        raise ExecutorError(
            "session_lost",
            f"session {session!r} holds {have} positions here, the step expects {position}: "
            "replay it",
        )

    def _adopt(self, step: Step, keep: Collection[str]) -> Any:
        """A new session's cache starting with the ``step.reuse`` positions of the
        prefix its keys name here; ``prefix_lost`` when this stage no longer keeps it
        (the caller then runs the prompt whole)."""
        block = self.prefixes.block
        j = step.reuse // block - 1
        source = None
        if step.scope is not None and step.reuse % block == 0 and 0 <= j < len(step.keys):
            source = self.prefixes.find(step.scope, step.keys[j])
        if source is None:
            raise ExecutorError(
                "prefix_lost",
                f"this stage keeps no cached prefix of {step.reuse} positions for session "
                f"{step.session!r}: run its prompt whole",
            )
        cache = self._new_cache(keep, source=source)
        self.stage.copy_prefix(source, cache, step.reuse)
        self.prefixes.took(step.reuse)
        return cache

    def _input(self, step: Step) -> Array:
        if step.tokens is not None:
            vocab = self.stage.config.vocab
            if not step.tokens or not all(0 <= t < vocab for t in step.tokens):
                raise ExecutorError(
                    "bad_request", f"token ids must be a non-empty list within 0..{vocab - 1}"
                )
            return self.stage.embed(step.tokens)
        width = self.stage.config.hidden
        if not step.hidden or len(step.hidden) % (4 * width):
            raise ExecutorError(
                "bad_activation",
                f"an activation of {len(step.hidden):,} bytes is not whole float32 rows of "
                f"{width} values",
            )
        x: Array = np.frombuffer(step.hidden, dtype="<f4").reshape(-1, width).astype(np.float32)
        return x

    def _new_cache(self, keep: Collection[str], source: Any = None) -> Any:
        """A cache for a new session; a stage with a fixed number of places (the
        engine's KV slots) gives up a prefix kept alone (not ``source``, the one the
        session is about to copy), else its least recently used session not stepping
        now."""
        while True:
            try:
                return self.stage.new_cache()
            except MemoryError:
                kept = self.prefixes.give_up_one(but=source)  # prefixes kept alone first
                if kept is not None:
                    self.stage.free(kept)
                    continue
                victim = next((k for k in self.caches if k not in keep), None)
                if victim is None:
                    raise ExecutorError(
                        "rate_limited",
                        "every KV place of this stage is held by a session of this batch",
                        retry_after_s=0.1,
                    ) from None
                self._drop(victim)

    def _drop(self, session: str, *, lost: bool = False) -> None:
        """Let ``session``'s cache go: to the prefix store if its prompt's blocks are
        known there (unless the session was ``lost``: then nothing of it is trusted),
        else freed."""
        held = self.caches.pop(session, None)
        if held is None:
            return
        cache = held[0]
        if lost:
            self.prefixes.drop(cache)
        elif self.prefixes.ended(cache):
            return
        self.stage.free(cache)

    def close(self, session: str) -> None:
        self._drop(session)
        for cache in self.prefixes.overflow():
            self.stage.free(cache)

    def _evict(self, now: float, keep: Collection[str] = ()) -> None:
        """Drop idle caches, then the least recently used past ``max_bytes``; never one
        of ``keep`` (the sessions about to step: evicting one would only make it replay).
        The round it starts ends with the store's overflow freed."""
        for key in [k for k, (_, seen) in self.caches.items() if now - seen > self.idle_s]:
            if key not in keep:
                self._drop(key)
        total = sum(c.nbytes() for c, _ in self.caches.values()) + self.prefixes.kept_bytes()
        while total > self.max_bytes:  # prefixes kept alone go first, then sessions
            kept = self.prefixes.give_up_one()
            if kept is None:
                break
            total -= kept.nbytes()
            self.stage.free(kept)
        for key in [k for k in self.caches if k not in keep]:
            if total <= self.max_bytes:
                break
            total -= self.caches[key][0].nbytes()  # oldest first: least recently used
            self._drop(key, lost=True)  # not kept: its bytes are what must go


def sample(
    logits: Array,
    *,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    step: int = 0,
) -> int:
    """Greedy at temperature 0; otherwise nucleus sampling, reproducible per (seed, step).

    Any temperature above 0 samples, however small (a subnormal one too: the top token
    is shifted to 0 before the division, so the rest go to -inf, never to inf - inf),
    and any integer seeds it (a negative one by its 64-bit two's complement, as a C
    sampler reads an int64 seed)."""
    if temperature <= 0:
        return int(np.argmax(logits))
    x = logits.astype(np.float64)
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        p = np.exp((x - x.max()) / temperature)
    total = p.sum()
    if not np.isfinite(total) or total <= 0:  # logits with no finite top: nothing to draw
        return int(np.argmax(logits))
    p /= total
    order = np.argsort(-p)
    keep = order[: int(np.searchsorted(np.cumsum(p[order]), top_p) + 1)]
    rng = np.random.default_rng(None if seed is None else [seed % 2**64, step])
    q = p[keep] / p[keep].sum()
    return int(keep[rng.choice(len(keep), p=q)])
