"""HECATE's swarm core: pure, synchronous, no I/O. The clock is always passed in.

Services are thin shells around these objects: they feed them messages and carry out
what they return.
"""

from hecate.core.cost import ColdPenalty, RouteWeights, stage_cost
from hecate.core.errors import (
    DuplicateNode,
    HecateError,
    InsufficientCapacity,
    NoHealthyPipeline,
    NoSuchModel,
    PlanError,
    RoutingError,
    SwarmStopped,
    UnknownNode,
    UnknownPlanner,
    Unrecoverable,
)
from hecate.core.failover import FailoverOptions, Recovered, Replacement, failover_in_swarm
from hecate.core.plan import ModelSpec, NodeProfile, Pipeline, PlanProblem, Stage, SwarmPlan
from hecate.core.planners import PLANNERS, GreedyPlanner, Planner, ProportionalPlanner, get_planner
from hecate.core.router import Router
from hecate.core.routing import Route, RoutingRequest, route_request
from hecate.core.state import SwarmState
from hecate.core.swarm import Growth, Removal, Swarm, SwarmConfig, SwarmStatus
from hecate.core.telemetry import NodeState, Sample, observe

__all__ = [
    "PLANNERS",
    "ColdPenalty",
    "DuplicateNode",
    "FailoverOptions",
    "GreedyPlanner",
    "Growth",
    "HecateError",
    "InsufficientCapacity",
    "ModelSpec",
    "NoHealthyPipeline",
    "NoSuchModel",
    "NodeProfile",
    "NodeState",
    "Pipeline",
    "PlanError",
    "PlanProblem",
    "Planner",
    "ProportionalPlanner",
    "Recovered",
    "Removal",
    "Replacement",
    "Route",
    "RouteWeights",
    "Router",
    "RoutingError",
    "RoutingRequest",
    "Sample",
    "Stage",
    "Swarm",
    "SwarmConfig",
    "SwarmPlan",
    "SwarmState",
    "SwarmStatus",
    "SwarmStopped",
    "UnknownNode",
    "UnknownPlanner",
    "Unrecoverable",
    "failover_in_swarm",
    "get_planner",
    "observe",
    "route_request",
    "stage_cost",
]
