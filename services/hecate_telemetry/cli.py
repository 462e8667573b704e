"""``hecate telemetry``: the telemetry service: heartbeats -> liveness, snapshot.

Runs until SIGTERM or SIGINT, then drains. Logs are JSON lines on stderr; traces go
to ``OTEL_EXPORTER_OTLP_ENDPOINT`` when it is set.
"""

from __future__ import annotations

import argparse
from typing import Any

from hecate.cli.process import instance_name as _instance
from hecate.cli.process import run_service, service_parser


def _cmd_telemetry(args: argparse.Namespace) -> int:
    from hecate_telemetry.config import TelemetryConfig
    from hecate_telemetry.service import Telemetry

    config = TelemetryConfig(
        instance_id=args.id or _instance("telemetry"),
        missed=args.missed,
        publish_s=args.publish_ms / 1000,
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
    tel.add_argument(
        "--missed",
        type=int,
        default=3,
        help="heartbeat intervals of silence always allowed; past them a node is down once "
        "its silence is unlikely given its own heartbeat history (phi accrual, at most 5 s)",
    )
    tel.add_argument("--publish-ms", type=float, default=100.0)
    tel.set_defaults(run=_cmd_telemetry)
