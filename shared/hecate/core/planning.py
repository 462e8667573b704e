"""The planner interface: what every strategy implements and what callers use.

:meth:`Planner.plan` plans every model in priority order (``ROLE_ORDER``: base, then the
reserve, then experts) and :meth:`Planner.copies` builds more copies of one model later
(growth, retirement); both hand a strategy's :meth:`Planner.replicas` only the nodes that
run the model's executor, so no strategy can give a model's layers to the wrong network.
The strategies themselves are in :mod:`hecate.core.planners`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, MutableMapping
from typing import ClassVar

from hecate.core.plan import ModelSpec, NodeProfile, Pipeline, SwarmPlan, executes

ROLE_ORDER = {"base": 0, "reserve": 1, "expert": 2}


def pipeline_id(model_id: str, index: int) -> str:
    return f"{model_id}-r{index}"


def renumbered(new: Iterable[Pipeline], taken: set[str], first: int) -> list[Pipeline]:
    """``new`` with ids no pipeline in ``taken`` has (a strategy numbers from ``first``
    and may land on an id past a gap in the numbering); adds them to ``taken``."""
    out: list[Pipeline] = []
    for p in new:
        pid, n = p.pipeline_id, first
        while pid in taken:
            n += 1
            pid = pipeline_id(p.model_id, n)
        taken.add(pid)
        out.append(Pipeline(pipeline_id=pid, model_id=p.model_id, stages=p.stages))
    return out


def most_copies(model: ModelSpec, free: Mapping[str, int]) -> int:
    """More copies of ``model`` than the ``free`` capacity can hold: the count an auto
    model asks the strategy for (it stops at the first copy that does not fit)."""
    return sum(max(0, f) for f in free.values()) // model.layers


def executors_for(model: ModelSpec, profiles: Mapping[str, NodeProfile]) -> dict[str, NodeProfile]:
    """The profiles of the nodes that may be given layers of ``model``."""
    return {i: n for i, n in profiles.items() if executes(n.executor, model)}


def unexecutable(
    models: Iterable[ModelSpec], nodes: Iterable[NodeProfile]
) -> list[tuple[ModelSpec, tuple[str, ...]]]:
    """Each model no node among ``nodes`` can execute, with the executors present."""
    nodes = tuple(nodes)
    present = tuple(sorted({n.executor for n in nodes}))
    return [(m, present) for m in models if not any(executes(n.executor, m) for n in nodes)]


class Planner(ABC):
    """A strategy. Subclasses implement :meth:`replicas`; :meth:`plan` and :meth:`copies`
    are shared, and are what callers use: they hand the strategy only the nodes that run
    the model's executor, so no strategy can get that wrong."""

    name: ClassVar[str]

    def plan(
        self, models: Iterable[ModelSpec], nodes: Iterable[NodeProfile], *, epoch: int = 1
    ) -> SwarmPlan:
        """Plan every model, as many replicas as each asks for and capacity allows, in
        priority order; then every further copy of an ``auto`` model that fits.

        Never raises for lack of capacity: a model gets fewer replicas (possibly none).
        The caller decides whether that is acceptable (see ``InsufficientCapacity``).
        """
        models = tuple(sorted(models, key=lambda m: (ROLE_ORDER[m.role], m.model_id)))
        profiles = {n.node_id: n for n in sorted(nodes, key=lambda n: n.node_id)}
        free = {i: n.capacity_layers for i, n in profiles.items()}
        pipelines: list[Pipeline] = []
        for m in models:
            pipelines += self.copies(m, m.replicas, free, profiles, first_index=0)
        for m in models:  # then every further copy an auto model's nodes can form
            if m.auto:
                pipelines += self.extra(m, pipelines, free, profiles)
        return SwarmPlan(
            epoch=epoch, models=models, nodes=tuple(profiles.values()), pipelines=tuple(pipelines)
        )

    def extra(
        self,
        model: ModelSpec,
        pipelines: Iterable[Pipeline],
        free: MutableMapping[str, int],
        profiles: Mapping[str, NodeProfile],
    ) -> list[Pipeline]:
        """Every further copy of ``model`` that ``free`` can hold beside its copies in
        ``pipelines``, asked of the strategy until it makes no more (one that seeds one
        copy per node group, as ``proportional`` does, makes them a round at a time)."""
        mine = [p for p in pipelines if p.model_id == model.model_id]
        taken = {p.pipeline_id for p in mine}
        out: list[Pipeline] = []
        while (count := most_copies(model, free)) > 0:
            avoid = frozenset(n for p in (*mine, *out) for n in p.node_ids)
            first = len(mine) + len(out)
            new = self.copies(model, count, free, profiles, first_index=first, avoid=avoid)
            if not new:
                break
            out += renumbered(new, taken, first)
        return out

    def copies(
        self,
        model: ModelSpec,
        count: int,
        free: MutableMapping[str, int],
        profiles: Mapping[str, NodeProfile],
        *,
        first_index: int,
        avoid: frozenset[str] = frozenset(),
    ) -> list[Pipeline]:
        """:meth:`replicas` of ``model`` on the nodes of ``profiles`` that execute it."""
        eligible = executors_for(model, profiles)
        if not eligible:
            return []
        return self.replicas(model, count, free, eligible, first_index=first_index, avoid=avoid)

    @abstractmethod
    def replicas(
        self,
        model: ModelSpec,
        count: int,
        free: MutableMapping[str, int],
        profiles: Mapping[str, NodeProfile],
        *,
        first_index: int,
        avoid: frozenset[str] = frozenset(),
    ) -> list[Pipeline]:
        """Up to ``count`` new pipelines of ``model`` from the ``free`` layer capacity.

        Consumes what it uses from ``free``. Nodes in ``avoid`` (already serving this
        model) are used only when nothing else fits. Pipeline ids start at ``first_index``.
        """
