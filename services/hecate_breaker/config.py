"""The breaker service's settings."""

from __future__ import annotations

import msgspec

from hecate.core.settings import BadConfig, named, positive
from hecate.resilience.breaker import BreakerConfig as CircuitConfig
from hecate_breaker.quotas import QuotaConfig

__all__ = ["BadConfig", "BreakerConfig"]


class BreakerConfig(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str = "breaker"
    failure_threshold: int = 5  # consecutive failures that open a circuit
    window_s: float = 30.0  # ...within this window
    cooldown_s: float = 60.0  # an open circuit rejects this long before one probe
    probe_timeout_s: float = 10.0  # a probe that has not reported by then counts as failed
    quotas: QuotaConfig = QuotaConfig()

    def __post_init__(self) -> None:
        named(self.instance_id, "instance_id")
        if self.failure_threshold < 1:
            raise BadConfig(f"failure_threshold: must be at least 1, got {self.failure_threshold}")
        positive(self.window_s, "window_s")
        positive(self.cooldown_s, "cooldown_s")
        positive(self.probe_timeout_s, "probe_timeout_s")

    def circuit(self) -> CircuitConfig:
        """What each target's circuit breaker runs on."""
        return CircuitConfig(
            failure_threshold=self.failure_threshold,
            window_s=self.window_s,
            cooldown_s=self.cooldown_s,
            probe_timeout_s=self.probe_timeout_s,
        )
