"""``hecate breaker``: the breaker service: shared circuit breakers in KV.

Runs until SIGTERM or SIGINT, then drains. Logs are JSON lines on stderr; traces go
to ``OTEL_EXPORTER_OTLP_ENDPOINT`` when it is set.
"""

from __future__ import annotations

import argparse
from typing import Any

from hecate.cli.flags import Flag, add_flags, config_from
from hecate.cli.process import instance_name as _instance
from hecate.cli.process import run_service, service_parser
from hecate_breaker.config import BreakerConfig

# Types and defaults are BreakerConfig's (hecate.cli.flags).
FLAGS = (
    Flag("failure_threshold", "consecutive failures that open a circuit"),
    Flag("window_s", "the failures must fall within this window"),
    Flag("cooldown_s", "how long an open circuit rejects before one probe"),
    Flag("probe_timeout_s", "a probe that does not report by then counts as failed"),
)


def _cmd_breaker(args: argparse.Namespace) -> int:
    from hecate_breaker.quotas import load_quotas
    from hecate_breaker.service import BreakerService

    config = config_from(
        args,
        BreakerConfig,
        FLAGS,
        instance_id=args.id or _instance("breaker"),
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
    add_flags(breaker, BreakerConfig, FLAGS)
    breaker.add_argument(
        "--quotas",
        default=None,
        help='tenant quotas, JSON: {"tenants": {"acme": {"requests_per_min": 60, '
        '"tokens_per_min": 20000, "burst": 10, "hold": false}}, "default": null}',
    )
    breaker.set_defaults(run=_cmd_breaker)
