"""How sure a paired ratio is of its side of a target: an interval for its median, and
a verdict only when the interval lies wholly on one side.

One run's ratio (tokens/s of two setups timed in turn) spreads by more than many of
the differences judged, so a median alone says "met" on noise. The interval here
assumes nothing of that spread's shape: it is the k-th smallest and the k-th largest of
the n paired ratios, which hold the median between them with probability
1 - 2·P(Binomial(n, ½) < k) (the sign test's interval). k is the largest that keeps
that confidence at :data:`LEVEL` or more; with too few pairs for it (fewer than five),
it is the whole range, at the confidence the range has (75 % for three). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import comb
from typing import Literal

LEVEL = 0.9

Verdict = bool | Literal["undecided"]


@dataclass(frozen=True, slots=True)
class Interval:
    low: float
    high: float
    confidence: float  # that the median lies within, 0..1

    def verdict_at_least(self, target: float) -> Verdict:
        """Met when the whole interval is at or above ``target``, not met when it is
        below, and undecided when it spans it."""
        if self.low >= target:
            return True
        if self.high < target:
            return False
        return "undecided"

    def verdict_at_most(self, target: float) -> Verdict:
        """Met when the whole interval is at or below ``target``, not met when it is
        above, and undecided when it spans it."""
        if self.high <= target:
            return True
        if self.low > target:
            return False
        return "undecided"


def _below(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) < k)."""
    return sum(comb(n, i) for i in range(k)) / 2**n


def median_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """The interval for the median of ``values`` (see the module's docstring). Raises
    ``ValueError`` for no values."""
    if not values:
        raise ValueError("no values")
    xs = sorted(values)
    n = len(xs)
    k = 1
    while k + 1 <= (n + 1) // 2 and 1 - 2 * _below(n, k + 1) >= level:
        k += 1
    return Interval(xs[k - 1], xs[n - k], 1 - 2 * _below(n, k))
