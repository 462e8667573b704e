"""``hecate planner``: the planner: membership -> plan in KV.

Runs until SIGTERM or SIGINT, then drains. Logs are JSON lines on stderr; traces go
to ``OTEL_EXPORTER_OTLP_ENDPOINT`` when it is set.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hecate.cli.process import instance_name as _instance
from hecate.cli.process import run_service, service_parser


def _cmd_planner(args: argparse.Namespace) -> int:
    from hecate_planner.config import PlannerConfig, swarm_from_topology
    from hecate_planner.service import PlannerService
    from hecate_planner.strategies import load

    config = PlannerConfig(
        swarm=swarm_from_topology(Path(args.topology).read_bytes(), args.pipelines),
        instance_id=args.id or _instance("planner"),
        settle_s=args.settle_ms / 1000,
    )
    strategy = load(args.strategy)
    return run_service(
        "planner",
        config.instance_id,
        args.nats,
        lambda log, tp: PlannerService(config, strategy, log=log, tracer_provider=tp),
    )


def add_parser(sub: Any) -> None:
    plan = service_parser(sub, "planner", "run the planner: membership -> plan in KV")
    plan.add_argument("--id", default=None)
    plan.add_argument("--topology", required=True, help="models and failover (nodes join)")
    plan.add_argument("--pipelines", type=int, default=None, help="base replicas (default 2)")
    plan.add_argument("--strategy", default="greedy", help="planner strategy name")
    plan.add_argument("--settle-ms", type=float, default=500.0)
    plan.set_defaults(run=_cmd_planner)
