"""The planner's settings."""

from __future__ import annotations

from typing import Literal

import msgspec

from hecate.core import SwarmConfig
from hecate.core.settings import BadConfig, named, positive

__all__ = ["BadConfig", "PlannerConfig", "swarm_from_topology"]


class PlannerConfig(msgspec.Struct, frozen=True, kw_only=True):
    swarm: SwarmConfig  # the models to plan and their failover options
    instance_id: str = "planner"
    settle_s: float = 0.5  # quiet after the last join before the first plan
    remind_s: float = 5.0  # how often the latest plan notice (and the members) is said again
    # A member telemetry calls down leaves the plan once it has stayed down this long: a
    # node frozen for a moment, or a link that blinks, costs no reshuffle, and the
    # routers' own failover (replica, splice, reserve) covers the wait.
    retire_after_s: float = 5.0
    # A member's changed profile (its capacity, latency, executor) is planned at most
    # once in this long; changes between wait their turn, the latest winning.
    profile_pace_s: float = 30.0

    def __post_init__(self) -> None:
        named(self.instance_id, "instance_id")
        positive(self.settle_s, "settle_s")
        positive(self.remind_s, "remind_s")
        positive(self.retire_after_s, "retire_after_s")
        positive(self.profile_pace_s, "profile_pace_s")


def swarm_from_topology(data: bytes, pipelines: int | Literal["auto"] = 2) -> SwarmConfig:
    """The swarm's models and failover options from a topology file (nodes join by bus)."""
    from hecate.sim.topology import parse_topology

    return parse_topology(data).swarm_config(pipelines)
