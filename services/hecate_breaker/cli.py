"""``hecate breaker``: the breaker service: shared circuit breakers in KV.

Runs until SIGTERM or SIGINT, then drains. Logs are JSON lines on stderr; traces go
to ``OTEL_EXPORTER_OTLP_ENDPOINT`` when it is set.
"""

from __future__ import annotations

import argparse
from typing import Any

from hecate.cli.process import instance_name as _instance
from hecate.cli.process import run_service, service_parser


def _cmd_breaker(args: argparse.Namespace) -> int:
    from hecate_breaker.config import BreakerConfig
    from hecate_breaker.quotas import load_quotas
    from hecate_breaker.service import BreakerService

    config = BreakerConfig(
        instance_id=args.id or _instance("breaker"),
        failure_threshold=args.failure_threshold,
        window_s=args.window_s,
        cooldown_s=args.cooldown_s,
        probe_timeout_s=args.probe_timeout_s,
        quotas=load_quotas(args.quotas),
    )
    return run_service(
        "breaker",
        config.instance_id,
        args.nats,
        lambda log, tp: BreakerService(config, log=log, tracer_provider=tp),
    )


def add_parser(sub: Any) -> None:
    breaker = service_parser(
        sub, "breaker", "run the breaker service: shared circuit breakers in KV"
    )
    breaker.add_argument("--id", default=None)
    breaker.add_argument(
        "--failure-threshold", type=int, default=5, help="consecutive failures that open a circuit"
    )
    breaker.add_argument(
        "--window-s", type=float, default=30.0, help="the failures must fall within this window"
    )
    breaker.add_argument(
        "--cooldown-s",
        type=float,
        default=60.0,
        help="how long an open circuit rejects before one probe",
    )
    breaker.add_argument(
        "--probe-timeout-s",
        type=float,
        default=10.0,
        help="a probe that does not report by then counts as failed",
    )
    breaker.add_argument(
        "--quotas",
        default=None,
        help='tenant quotas, JSON: {"tenants": {"acme": {"requests_per_min": 60, '
        '"tokens_per_min": 20000, "burst": 10, "hold": false}}, "default": null}',
    )
    breaker.set_defaults(run=_cmd_breaker)
