"""Each node's share of a plan, and which shares a new plan changes.

A node needs only the ranges the plan gives it, so the planner writes those under a key
of the node's own (``hecate-plan/node.<id>``) and tells everyone, in the plan notice,
which nodes it changed. The whole plan grows with the swarm (about 180 bytes a node);
a node's share does not, and a plan that moves a few nodes rewrites a few keys.
Pure: the service writes what :func:`changes` returns.
"""

from __future__ import annotations

from collections.abc import Mapping

from hecate.core import SwarmPlan
from hecate.wire.messages import Held

#: A notice names the nodes it changed up to this many; past it, it names nobody and
#: every node reads its own share (a name costs every node its bytes to read).
MOST_NAMED = 64

Shares = dict[str, tuple[Held, ...]]


def shares(plan: SwarmPlan) -> Shares:
    """Every node of the plan and the ranges it holds (none for a spare), in the
    plan's order."""
    executor = {m.model_id: m.executor for m in plan.models}
    out: dict[str, list[Held]] = {n.node_id: [] for n in plan.nodes}
    for p in plan.pipelines:
        for s in p.stages:
            out.setdefault(s.node_id, []).append(
                Held(
                    model_id=p.model_id,
                    layer_start=s.layer_start,
                    layer_end=s.layer_end,
                    executor=executor.get(p.model_id, ""),
                )
            )
    return {node_id: tuple(held) for node_id, held in out.items()}


def changes(written: Mapping[str, tuple[Held, ...]], plan: SwarmPlan) -> Shares:
    """The shares to write for ``plan``, given those ``written`` already: every node
    whose share differs, and every node written before that the plan no longer holds
    (its share is then empty: a node that left and comes back starts from nothing)."""
    now = shares(plan)
    out = {n: held for n, held in now.items() if written.get(n) != held}
    out.update({n: () for n, held in written.items() if n not in now and held})
    return out


def named(changed: Mapping[str, object]) -> tuple[str, ...] | None:
    """What a notice says was changed: the nodes, sorted, or None past
    :data:`MOST_NAMED`."""
    return tuple(sorted(changed)) if len(changed) <= MOST_NAMED else None
