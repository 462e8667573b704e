"""A node's room for its model: how many layers fit its memory, and which ranges a plan
gives it that do not.

As a node starts it weighs its model (:func:`weigh`): the executor says what each
block, the head, a layer's KV budget and loading cost (:class:`Footprint`, from the
file's header alone), the node reads its memory (:mod:`hecate_node.memory`) and what
it uses already, and the difference is its budget. It joins saying how many layers fit
that budget (its ``capacity_layers``, unless the operator gave ``--capacity-layers``),
its memory and a layer's bytes. When a plan gives it ranges, it loads only those that
fit beside what it holds (:meth:`Room.admit`) and refuses the rest before reading a
weight, naming the bytes: the node then joins again with the capacity that fits, and
the planner plans around it. Never an out-of-memory kill to find out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hecate.model.footprint import Footprint, Range, Refusal, Weighed, fitting
from hecate_node.memory import Memory, in_use, read


@dataclass
class Room:
    footprint: Footprint
    memory: Memory
    #: what the node may hold: its memory less what it used before loading anything
    budget: int
    #: the most layers of a range that fit the budget, the head counted
    fit: int
    #: ranges refused for lack of memory since the node started
    refused: int = 0

    def admit(
        self, held: Sequence[Range], given: Sequence[Range]
    ) -> tuple[list[Range], Refusal | None]:
        """Of the ranges ``given``, those to load beside the ``held`` ones, and the
        refusal of the others (counted)."""
        keep, refusal = fitting(self.footprint, held, given, self.budget, self.memory.source)
        if refusal is not None:
            self.refused += 1
        return keep, refusal

    def capacity_after(self, declared: int, kept: Sequence[Range]) -> int:
        """The capacity to join with again after a refusal: what fits, or, when that
        is what was declared already, the layers the node could keep."""
        fits = min(declared, self.fit)
        return fits if fits < declared else sum(b - a for a, b in kept)


def weigh(executor: object, memory_flag: int | None) -> Room | None:
    """The room of a node running ``executor`` (None for an executor that cannot say
    what its layers cost: the toy and upstream ones). Reads the model file's header."""
    if not isinstance(executor, Weighed):
        return None
    footprint = executor.footprint()
    memory = read(memory_flag)
    # What the machine has free already leaves out what this process holds.
    budget = memory.limit if memory.source == "free" else max(memory.limit - in_use(), 0)
    return Room(footprint, memory, budget, footprint.layers_within(budget))


def memory_status(room: Room | None) -> dict[str, object]:
    """What ``$SRV.STATS`` shows of a node's memory: in use, its limit and where it
    comes from, its budget for weights and KV, and the ranges refused for want of it."""
    shown: dict[str, object] = {"in_use": in_use()}
    if room is not None:
        shown |= {
            "limit": room.memory.limit,
            "from": room.memory.source,
            "budget": room.budget,
            "fit_layers": room.fit,
            "refused": room.refused,
        }
    return shown
