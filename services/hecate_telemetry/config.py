"""Telemetry's settings."""

from __future__ import annotations

import msgspec

from hecate.core.settings import BadConfig, named, positive
from hecate.core.telemetry import DEFAULT_ALPHA
from hecate.wire import subjects
from hecate_telemetry.liveness import LivenessConfig

__all__ = ["BadConfig", "TelemetryConfig"]


class TelemetryConfig(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str = "telemetry"
    missed: int = 3  # heartbeat intervals of silence always allowed
    publish_s: float = 0.1  # the snapshot is written at most this often (unless urgent)
    alpha: float = DEFAULT_ALPHA  # the EWMA's weight of a new sample
    liveness: LivenessConfig = LivenessConfig()
    # This replica hears the intake partitions p with p % shards == shard, and writes
    # the snapshot of their nodes under its own key (hecate.wire.subjects).
    shard: int = 0
    shards: int = 1

    def __post_init__(self) -> None:
        named(self.instance_id, "instance_id")
        if self.missed < 0:
            raise BadConfig(f"missed: must not be negative, got {self.missed}")
        positive(self.publish_s, "publish_s")
        if not 0 < self.alpha <= 1:
            raise BadConfig(f"alpha: must be in (0, 1], got {self.alpha!r}")
        if not 0 < self.shards <= subjects.INTAKE_PARTITIONS:
            raise BadConfig(
                f"shards: must be 1..{subjects.INTAKE_PARTITIONS} (the intake's partitions), "
                f"got {self.shards}"
            )
        if not 0 <= self.shard < self.shards:
            raise BadConfig(f"shard: must be 0..{self.shards - 1}, got {self.shard}")

    def detector(self) -> LivenessConfig:
        """The failure detector's settings, with ``missed`` intervals always allowed."""
        return msgspec.structs.replace(self.liveness, min_missed=float(self.missed))
