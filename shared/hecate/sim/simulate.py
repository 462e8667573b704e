"""``hecate swarm-sim``: the whole lifecycle in memory, as one JSON document.

start → one failover per killed node, in order → one growth per newcomer. After each
step: the swarm status and the route the request would take. A policy review tool and
a test bench for the core, with no network and no clock.

Routes and rescues are decided by the router's own policy (the core's
:class:`~hecate.core.chooser.Chooser`, which every :class:`Swarm` decides through), so
what the simulation shows is what a running router would do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

from hecate.core import (
    FailoverOptions,
    Pipeline,
    Recovered,
    Replacement,
    Route,
    RoutingError,
    RoutingRequest,
    Swarm,
    get_planner,
)
from hecate.core.chooser import Chooser
from hecate.core.plan import PlanProblem
from hecate.sim.topology import Replicas, Topology, TopologyError


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True):
    code: str
    message: str


class PlanView(msgspec.Struct, frozen=True, kw_only=True):
    epoch: int
    pipelines: tuple[Pipeline, ...]


class StartStep(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="step", tag="start"
):
    status: str
    route: Route | None
    degraded: bool = False
    error: ErrorInfo | None = None


class FailoverStep(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="step", tag="failover"
):
    killed: str
    kind: Literal["unaffected", "replica", "splice", "degraded", "unrecoverable"]
    degraded: bool
    replaced: tuple[Replacement, ...]
    status: str
    route: Route | None
    error: ErrorInfo | None = None


class GrowthStep(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="step", tag="growth"
):
    added: str
    kind: str
    pipelines: tuple[str, ...]
    status: str
    route: Route | None
    degraded: bool = False
    error: ErrorInfo | None = None


Step = StartStep | FailoverStep | GrowthStep


class SimReport(msgspec.Struct, frozen=True, kw_only=True):
    plan: PlanView
    steps: tuple[Step, ...]
    final_plan_valid: bool
    final_plan_problems: tuple[PlanProblem, ...]


def simulate(
    topology: Topology,
    *,
    policy: Callable[[FailoverOptions], Chooser] = Chooser,
    kills: tuple[str, ...] = (),
    pipelines: Replicas = 2,
    planner: str = "greedy",
) -> SimReport:
    """Run the lifecycle, routing with ``policy(failover options of the topology)`` (a
    chooser with other weights, say; by default the router's). Raises
    :class:`HecateError` subclasses for bad input."""
    known = {n.id for n in topology.nodes}
    for k in kills:
        if k not in known:
            raise TopologyError(
                f"--kill names unknown node {k!r}; nodes: {', '.join(sorted(known))}"
            )
    base = topology.base
    config = topology.swarm_config(pipelines)
    swarm = Swarm(
        [n.profile() for n in topology.nodes],
        config,
        planner=get_planner(planner),
        policy=policy(config.failover),
    )
    held = len(swarm.plan.pipelines_of(base.id))
    if pipelines != "auto" and held < pipelines:
        raise TopologyError(
            f"the topology holds {held} of the {pipelines} requested pipelines "
            f"of {base.id!r}; add capacity or ask for fewer"
        )
    model_id = topology.request.model_id or base.id
    request = RoutingRequest(tokens=topology.request.tokens)
    start_plan = PlanView(epoch=swarm.plan.epoch, pipelines=swarm.plan.pipelines)

    def current() -> tuple[Route | None, bool, ErrorInfo | None]:
        try:
            route, degraded = swarm.choose(request, model_id)
        except RoutingError as exc:
            return None, False, ErrorInfo(code=exc.code, message=exc.message)
        return route, degraded, None

    route, degraded, error = current()
    steps: list[Step] = [
        StartStep(status=swarm.status(), route=route, degraded=degraded, error=error)
    ]
    for k in kills:
        result = swarm.mark_down(k, request, model_id)
        if isinstance(result, Recovered):
            steps.append(
                FailoverStep(
                    killed=k,
                    kind=result.kind,
                    degraded=result.degraded,
                    replaced=result.replaced,
                    status=swarm.status(),
                    route=result.route,
                )
            )
        else:
            steps.append(
                FailoverStep(
                    killed=k,
                    kind="unrecoverable",
                    degraded=False,
                    replaced=(),
                    status=swarm.status(),
                    route=None,
                    error=ErrorInfo(code=result.code, message=result.message),
                )
            )
    for newcomer in topology.growth:
        growth = swarm.add_node(newcomer.profile())
        route, degraded, error = current()
        steps.append(
            GrowthStep(
                added=newcomer.id,
                kind=growth.kind,
                pipelines=growth.pipelines,
                status=swarm.status(),
                route=route,
                degraded=degraded,
                error=error,
            )
        )
    problems = tuple(swarm.plan.validate())
    return SimReport(
        plan=start_plan,
        steps=tuple(steps),
        final_plan_valid=not problems,
        final_plan_problems=problems,
    )
