"""Which waiting generation steps a node runs together as its next batch.

Pure: items in arrival order in, the batch and the rest out. The rules:

- oldest first, so no step waits behind ones that came after it;
- a session steps once per batch, in order (its next step expects the positions this
  one adds);
- a decode step (one position) always joins: it costs the batch almost nothing, since
  every weight read once serves all the rows;
- prefill rows (a prompt chunk, a replay) are bounded per batch (``prefill_rows``): one
  long prompt is run chunk by chunk between everyone's decode steps instead of stalling
  them for its whole length. The oldest prefill always gets in, whatever its size, so
  one larger than the bound still runs; a step whose size is not known yet (a prompt
  still to tokenize) counts as the whole bound.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

T = TypeVar("T")

#: A batch's bound on its number of steps, so that one batch's time stays bounded too.
MAX_BATCH = 64


def take_batch(
    waiting: Sequence[T],
    *,
    key: Callable[[T], Hashable],
    rows: Callable[[T], int | None],
    prefill_rows: int,
    max_batch: int = MAX_BATCH,
) -> tuple[list[T], list[T]]:
    """Split ``waiting`` (oldest first) into the next batch and what waits for a later
    one, both in arrival order. ``key`` names an item's session; ``rows`` is how many
    positions it runs (``None``: not known yet)."""
    batch: list[T] = []
    rest: list[T] = []
    sessions: set[Hashable] = set()
    prefill = 0
    for item in waiting:
        k = key(item)
        n = rows(item)
        heavy = n is None or n > 1
        size = prefill_rows if n is None else n
        blocked = (
            len(batch) >= max_batch
            or k in sessions
            or (heavy and prefill > 0 and prefill + size > prefill_rows)
        )
        sessions.add(k)  # taken or not: a session's later steps wait behind this one
        if blocked:
            rest.append(item)
            continue
        batch.append(item)
        if heavy:
            prefill += max(size, 1)
    return batch, rest
