"""What layer ranges of a model cost a node's memory, worked out before a weight is read.

An executor that holds weights says, from its model's file alone, what each block and
the last stage's head take as its engine holds them, what a layer's KV budget takes,
and what loading adds for a while (:class:`Footprint`). A node uses it twice: as it
joins, to say how many layers fit its memory (:meth:`Footprint.layers_within`), and as
a plan gives it ranges, to refuse those that do not fit before it loads them
(:meth:`Footprint.need`), naming the bytes. Never an out-of-memory kill to find out.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

Range = tuple[int, int]


def mib(n: int) -> str:
    """``n`` bytes as an operator reads them: MiB below a GiB, else GiB."""
    return f"{n / 2**20:,.0f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


@dataclass(frozen=True, slots=True)
class Need:
    """What some ranges need: their weights as held, their KV budget, and what loading
    adds above both while it lasts."""

    weights: int
    kv: int
    loading: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.loading

    def __str__(self) -> str:
        return (
            f"{mib(self.total)} (weights {mib(self.weights)} as held, KV {mib(self.kv)}, "
            f"{mib(self.loading)} more while loading)"
        )


@dataclass(frozen=True, slots=True)
class Footprint:
    """A model's cost in memory, per block, on one engine.

    ``blocks``: each block's bytes as the engine holds them; ``head``: what the last
    stage holds besides its blocks (the final norm and the output matrix; the first
    stage's embedding is read from the mapped file, not held); ``kv_per_layer``: a
    layer's KV budget (the positions a stage keeps for its sessions at most, times a
    position's bytes); ``loading``: what building a range holds above what stays."""

    blocks: tuple[int, ...]
    head: int
    kv_per_layer: int
    loading: int

    @property
    def layers(self) -> int:
        return len(self.blocks)

    def need(self, ranges: Iterable[Range]) -> Need:
        """What holding every range of ``ranges`` together needs."""
        ranges = list(ranges)
        weights = sum(sum(self.blocks[a:b]) for a, b in ranges)
        weights += self.head * any(b == self.layers for _a, b in ranges)
        kv = self.kv_per_layer * sum(b - a for a, b in ranges)
        return Need(weights=weights, kv=kv, loading=self.loading if ranges else 0)

    def layer_bytes(self) -> int:
        """What the costliest layer takes with its KV budget: the figure a node
        declares, for the planner's view and the operator's."""
        return max(self.blocks, default=0) + self.kv_per_layer

    def layers_within(self, budget: int) -> int:
        """The most layers any range of that many layers fits in ``budget`` bytes with,
        the head counted (whichever range the plan gives, the last stage included)."""
        widest = 0
        for n in range(1, self.layers + 1):
            if self._costliest(n) > budget:
                break
            widest = n
        return widest

    def _costliest(self, n: int) -> int:
        """The most any ``n`` contiguous layers need, held with the head."""
        windows = (sum(self.blocks[a : a + n]) for a in range(self.layers - n + 1))
        worst = max(windows, default=0)
        return worst + self.head + self.kv_per_layer * n + self.loading


@dataclass(frozen=True, slots=True)
class Refusal:
    """Ranges a node will not load: what they need against what it has."""

    ranges: tuple[Range, ...]
    need: Need
    budget: int
    source: str

    def __str__(self) -> str:
        spans = ", ".join(f"{a}-{b}" for a, b in self.ranges)
        return (
            f"layers {spans} need {self.need}; this node has {mib(self.budget)} "
            f"({self.source}) for them"
        )


def fitting(
    footprint: Footprint,
    held: Sequence[Range],
    given: Sequence[Range],
    budget: int,
    source: str,
) -> tuple[list[Range], Refusal | None]:
    """Of ``given`` (the plan's ranges, in its order), those the node loads beside the
    ``held`` ones it has loaded already, each newly given range taken while the whole
    still fits ``budget``; and the refusal of the rest, if any."""
    keep = [r for r in given if r in held]
    refused: list[Range] = []
    for r in given:
        if r in keep:
            continue
        if footprint.need([*keep, r]).total <= budget:
            keep.append(r)
        else:
            refused.append(r)
    if not refused:
        return keep, None
    return keep, Refusal(tuple(refused), footprint.need([*keep, *refused]), budget, source)


@runtime_checkable
class Weighed(Protocol):
    """An executor that can say what its model's ranges cost in memory."""

    def footprint(self) -> Footprint:
        """Worked out from the model's file header alone; no weight is read."""
        ...
