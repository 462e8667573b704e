"""A node's share of generation: its stage of the model, and one KV cache per session.

A session is one generation (one attempt of one request). Each step brings the next
positions: token ids on the first stage, the previous stage's hidden state on the
others. ``position`` says how many positions the caller believes this stage already
holds; a mismatch (a cache evicted, a node restarted) is an explicit ``session_lost``,
never a silently wrong continuation: the router then replays the whole sequence.
Caches are bounded in total bytes and dropped after ``idle_s`` without a step.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from hecate.llm.llama import Array, KVCache, LlamaStage
from hecate.model.executor import ExecutorError


class Sessions:
    def __init__(
        self,
        stage: LlamaStage,
        *,
        max_bytes: int = 256 * 1024 * 1024,
        idle_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stage = stage
        self.max_bytes = max_bytes
        self.idle_s = idle_s
        self.clock = clock
        self.caches: OrderedDict[str, tuple[KVCache, float]] = OrderedDict()

    def step(
        self,
        session: str,
        position: int,
        *,
        tokens: list[int] | None = None,
        hidden: bytes = b"",
    ) -> Array:
        """Run the next positions of ``session``; returns this stage's output hidden."""
        now = self.clock()
        self._evict(now)
        held = self.caches.get(session)
        if held is None and position == 0:
            cache = self.stage.new_cache()
        elif held is not None and held[0].length == position:
            cache = held[0]
        else:
            have = held[0].length if held else 0
            self.caches.pop(session, None)
            raise ExecutorError(
                "session_lost",
                f"session {session!r} holds {have} positions "
                f"here, the step expects {position}: replay it",
            )
        if tokens is not None:
            x = self.stage.embed(tokens)
        else:
            x = np.frombuffer(hidden, dtype="<f4").reshape(-1, self.stage.config.hidden)
        out = self.stage.forward(x.astype(np.float32), cache)
        self.caches[session] = (cache, now)
        self.caches.move_to_end(session)
        return out

    def close(self, session: str) -> None:
        self.caches.pop(session, None)

    def _evict(self, now: float) -> None:
        for key in [k for k, (_, seen) in self.caches.items() if now - seen > self.idle_s]:
            del self.caches[key]
        total = sum(c.nbytes() for c, _ in self.caches.values())
        while total > self.max_bytes and self.caches:
            _, (cache, _) = self.caches.popitem(last=False)  # least recently used
            total -= cache.nbytes()


def sample(
    logits: Array,
    *,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    step: int = 0,
) -> int:
    """Greedy at temperature 0; otherwise nucleus sampling, reproducible per (seed, step)."""
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    z -= z.max()
    p = np.exp(z)
    p /= p.sum()
    order = np.argsort(-p)
    keep = order[: int(np.searchsorted(np.cumsum(p[order]), top_p) + 1)]
    rng = np.random.default_rng(None if seed is None else [seed, step])
    q = p[keep] / p[keep].sum()
    return int(keep[rng.choice(len(keep), p=q)])
