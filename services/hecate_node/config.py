"""What a node is started with: who it is, what it computes, and how often it reports."""

from __future__ import annotations

import math

import msgspec

from hecate.core.plan import NodeProfile
from hecate.core.telemetry import BEAT_BUDGET_PER_S


class NodeConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A node's settings, checked when built: a bad one stops the start with an error
    naming the field, not a node that misbehaves later.

    ``executor`` names what computes the node's ranges (:mod:`hecate.executors`); the
    profile the node joins with carries it, whatever the given profile said."""

    profile: NodeProfile
    executor: str = "toy"
    heartbeat_s: float = 0.1
    # The whole swarm's beats a second that a node keeps to, as the plan says how many
    # nodes there are: slower beats past it, never slower than heartbeat_most_s
    # (hecate.core.telemetry.beat_interval).
    heartbeat_budget_per_s: float = BEAT_BUDGET_PER_S
    heartbeat_most_s: float = 1.0
    # An idle node measures its ranges again this often (see node_holdings).
    remeasure_s: float = 5.0
    # Listen for injected faults (chaos runs only).
    accept_faults: bool = False
    # The memory the node may use (``--memory``); None: its cgroup's limit, else what
    # the machine has free (hecate_node.memory).
    memory: int | None = None
    # Whether the profile's capacity_layers is what fits that memory, worked out as the
    # node starts (no ``--capacity-layers``), rather than the operator's figure.
    capacity_from_memory: bool = False

    def __post_init__(self) -> None:
        if not self.profile.node_id:
            raise ValueError("profile.node_id: must not be empty")
        if self.profile.capacity_layers < 0:
            raise ValueError(
                f"profile.capacity_layers: must not be negative, got {self.profile.capacity_layers}"
            )
        if self.memory is not None and self.memory <= 0:
            raise ValueError(f"memory: must be a positive number of bytes, got {self.memory}")
        if not self.executor:
            raise ValueError("executor: must name an executor")
        for name, unit in (
            ("heartbeat_s", "seconds"),
            ("remeasure_s", "seconds"),
            ("heartbeat_most_s", "seconds"),
            ("heartbeat_budget_per_s", "beats a second"),
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: must be a positive number of {unit}, got {value}")

    def joined(self) -> NodeProfile:
        """The profile the node joins with: its own, saying which executor it runs."""
        return msgspec.structs.replace(self.profile, executor=self.executor)
