"""The planner's, telemetry's and breaker's settings: one validated struct per service.

Each is built by its ``hecate`` command from the flags and checked on construction, so
a bad value stops the service at start with the field's name, rather than surfacing
later as an odd decision. Defaults are the commands' defaults. Runtime objects (the
logger, the tracer provider, the planning strategy) are passed beside the config.
"""

from __future__ import annotations

import msgspec

from hecate.core import HecateError, SwarmConfig
from hecate.core.liveness import LivenessConfig
from hecate.core.telemetry import DEFAULT_ALPHA
from hecate.resilience.breaker import BreakerConfig as CircuitConfig
from hecate.services.quotas import QuotaConfig

__all__ = ["BadConfig", "BreakerConfig", "PlannerConfig", "TelemetryConfig", "swarm_from_topology"]


class BadConfig(HecateError, ValueError):
    """A setting out of its range: the message starts with the field's name. A
    ValueError too, so that msgspec reports it as a validation error when decoding."""

    code = "bad_config"


def _named(value: str, field: str) -> None:
    if not value:
        raise BadConfig(f"{field}: must not be empty")


def _positive(value: float, field: str, unit: str = "seconds") -> None:
    if not value > 0:  # also refuses NaN
        raise BadConfig(f"{field}: must be a positive number of {unit}, got {value!r}")


class PlannerConfig(msgspec.Struct, frozen=True, kw_only=True):
    swarm: SwarmConfig  # the models to plan and their failover options
    instance_id: str = "planner"
    settle_s: float = 0.5  # quiet after the last join before the first plan

    def __post_init__(self) -> None:
        _named(self.instance_id, "instance_id")
        _positive(self.settle_s, "settle_s")


def swarm_from_topology(data: bytes, pipelines: int | None = None) -> SwarmConfig:
    """The swarm's models and failover options from a topology file (nodes join by bus)."""
    from hecate.sim.topology import parse_topology

    return parse_topology(data).swarm_config(pipelines or 2)


class TelemetryConfig(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str = "telemetry"
    missed: int = 3  # heartbeat intervals of silence always allowed
    publish_s: float = 0.1  # the snapshot is written at most this often (unless urgent)
    alpha: float = DEFAULT_ALPHA  # the EWMA's weight of a new sample
    liveness: LivenessConfig = LivenessConfig()

    def __post_init__(self) -> None:
        _named(self.instance_id, "instance_id")
        if self.missed < 0:
            raise BadConfig(f"missed: must not be negative, got {self.missed}")
        _positive(self.publish_s, "publish_s")
        if not 0 < self.alpha <= 1:
            raise BadConfig(f"alpha: must be in (0, 1], got {self.alpha!r}")

    def detector(self) -> LivenessConfig:
        """The failure detector's settings, with ``missed`` intervals always allowed."""
        return msgspec.structs.replace(self.liveness, min_missed=float(self.missed))


class BreakerConfig(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str = "breaker"
    failure_threshold: int = 5  # consecutive failures that open a circuit
    window_s: float = 30.0  # ...within this window
    cooldown_s: float = 60.0  # an open circuit rejects this long before one probe
    probe_timeout_s: float = 10.0  # a probe that has not reported by then counts as failed
    quotas: QuotaConfig = QuotaConfig()

    def __post_init__(self) -> None:
        _named(self.instance_id, "instance_id")
        if self.failure_threshold < 1:
            raise BadConfig(f"failure_threshold: must be at least 1, got {self.failure_threshold}")
        _positive(self.window_s, "window_s")
        _positive(self.cooldown_s, "cooldown_s")
        _positive(self.probe_timeout_s, "probe_timeout_s")

    def circuit(self) -> CircuitConfig:
        """What each target's circuit breaker runs on."""
        return CircuitConfig(
            failure_threshold=self.failure_threshold,
            window_s=self.window_s,
            cooldown_s=self.cooldown_s,
            probe_timeout_s=self.probe_timeout_s,
        )
