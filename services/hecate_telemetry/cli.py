"""``hecate telemetry``: the telemetry service: heartbeats -> liveness, snapshot.

Runs until SIGTERM or SIGINT, then drains. Logs are JSON lines on stderr; traces go
to ``OTEL_EXPORTER_OTLP_ENDPOINT`` when it is set.
"""

from __future__ import annotations

import argparse
from typing import Any

from hecate.cli.flags import Flag, add_flags, config_from
from hecate.cli.process import instance_name as _instance
from hecate.cli.process import run_service, service_parser
from hecate_telemetry.config import TelemetryConfig

# Types and defaults are TelemetryConfig's (hecate.cli.flags).
FLAGS = (
    Flag(
        "missed",
        "heartbeat intervals of silence always allowed; past them a node is down once "
        "its silence is unlikely given its own heartbeat history (phi accrual, at most 5 s)",
    ),
    Flag("publish_s", "what changed is published at most this often", unit="ms"),
    Flag(
        "tolerance",
        "followers are told a node's figures again once one moved by more than this "
        "part of what they were told (liveness and in-flight: any change)",
    ),
    Flag("keyframe_min_s", "the whole snapshot is put in KV at most this often", unit="ms"),
    Flag(
        "keyframe_bytes_s",
        "and no more bytes a second than this on average (a large swarm's, less often)",
    ),
    Flag(
        "flips_cap",
        "a snapshot is put at once when more nodes than this went up or down since the last",
    ),
    Flag(
        "shards",
        "telemetry replicas sharing the heartbeat intake (1-16): each hears the nodes of "
        "its own partitions and writes their snapshot under its own key",
    ),
    Flag("shard", "which of the --shards replicas this one is (0 to shards - 1)"),
    Flag(
        "lease_s",
        "replicas of one shard (more than one --id per --shard) share a lease: its holder "
        "speaks, a standby judges silently and takes over once the term passed unrenewed",
        unit="ms",
    ),
)


def _cmd_telemetry(args: argparse.Namespace) -> int:
    from hecate_telemetry.service import Telemetry

    config = config_from(
        args, TelemetryConfig, FLAGS, instance_id=args.id or _instance("telemetry")
    )
    return run_service(
        "telemetry",
        config.instance_id,
        args.nats,
        lambda log, tp: Telemetry(config, log=log, tracer_provider=tp),
    )


def add_parser(sub: Any) -> None:
    tel = service_parser(
        sub, "telemetry", "run the telemetry service: heartbeats -> liveness, snapshot"
    )
    tel.add_argument("--id", default=None)
    add_flags(tel, TelemetryConfig, FLAGS)
    tel.set_defaults(run=_cmd_telemetry)
