"""How long to wait before a retry: the seed's policy, full jitter, decorrelated jitter.

Each policy is a small object with its own seeded RNG (tests and the herd benchmark
replay it exactly). ``hint`` is the upstream's wait (:func:`parse_retry_after`); every
policy waits at least that long, because retrying sooner than asked only earns
another 429.

* ``seed``: hint (1 s without one) + U(0.1, 0.5) s, as the seed prescribes.
* ``full``: hint + U(0, min(cap, base·2^attempt)) (Brooker's "full jitter" on top of
  the hint).
* ``decorrelated``: hint + min(cap, U(base, 3·previous)) (Brooker's "decorrelated").

Which spreads a herd best is measured, not asserted: ``hecate bench herd``.
"""

from __future__ import annotations

import random
from typing import Protocol


class WaitPolicy(Protocol):
    name: str

    def wait(self, attempt: int, hint: float | None) -> float:
        """Seconds to wait before retry number ``attempt`` (1 = the first retry)."""
        ...


class SeedPolicy:
    name = "seed"

    def __init__(
        self,
        seed: int | None = None,
        *,
        default_s: float = 1.0,
        jitter: tuple[float, float] = (0.1, 0.5),
    ) -> None:
        self.rng = random.Random(seed)
        self.default_s = default_s
        self.jitter = jitter

    def wait(self, attempt: int, hint: float | None) -> float:
        del attempt
        base = hint if hint is not None and hint > 0 else self.default_s
        return base + self.rng.uniform(*self.jitter)


class FullJitter:
    name = "full"

    def __init__(
        self, seed: int | None = None, *, base_s: float = 0.5, cap_s: float = 30.0
    ) -> None:
        self.rng = random.Random(seed)
        self.base_s = base_s
        self.cap_s = cap_s

    def wait(self, attempt: int, hint: float | None) -> float:
        spread = min(self.cap_s, self.base_s * 2.0 ** min(max(attempt, 0), 64))
        return (hint or 0.0) + self.rng.uniform(0.0, spread)


class DecorrelatedJitter:
    name = "decorrelated"

    def __init__(
        self, seed: int | None = None, *, base_s: float = 0.5, cap_s: float = 30.0
    ) -> None:
        self.rng = random.Random(seed)
        self.base_s = base_s
        self.cap_s = cap_s
        self.previous = base_s

    def wait(self, attempt: int, hint: float | None) -> float:
        if attempt <= 1:
            self.previous = self.base_s
        self.previous = min(self.cap_s, self.rng.uniform(self.base_s, self.previous * 3))
        return (hint or 0.0) + self.previous


POLICIES = {"seed": SeedPolicy, "full": FullJitter, "decorrelated": DecorrelatedJitter}
