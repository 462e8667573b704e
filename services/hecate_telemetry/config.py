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
    publish_s: float = 0.1  # a delta is published at most this often (unless urgent)
    # Followers are told a node's figures again once one moved by more than this part
    # of what they were told (hecate_telemetry.telling.Tolerance).
    tolerance: float = 0.1
    # The whole snapshot is put in KV at most this often, and no more bytes a second
    # than keyframe_bytes_s on average, unless more than flips_cap nodes went up or
    # down since the last one.
    keyframe_min_s: float = 1.0
    keyframe_bytes_s: int = 128 * 1024
    flips_cap: int = 64
    # Replicas of one shard share a lease (hecate_telemetry.lease): its holder speaks,
    # renewing it every third of this term; a standby takes over once it passed.
    lease_s: float = 5.0
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
        positive(self.keyframe_min_s, "keyframe_min_s")
        positive(self.lease_s, "lease_s")
        positive(self.keyframe_bytes_s, "keyframe_bytes_s", "bytes a second")
        if not 0 <= self.tolerance < 1:
            raise BadConfig(f"tolerance: must be in [0, 1), got {self.tolerance!r}")
        if self.flips_cap < 0:
            raise BadConfig(f"flips_cap: must not be negative, got {self.flips_cap}")
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
