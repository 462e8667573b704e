"""``hecate planner``: the planner: membership -> plan in KV.

Runs until SIGTERM or SIGINT, then drains. Logs are JSON lines on stderr; traces go
to ``OTEL_EXPORTER_OTLP_ENDPOINT`` when it is set.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hecate.cli.flags import Flag, add_flags, config_from, pipelines
from hecate.cli.process import instance_name as _instance
from hecate.cli.process import run_service, service_parser
from hecate_planner.config import PlannerConfig

# Types and defaults are PlannerConfig's (hecate.cli.flags).
FLAGS = (
    Flag("settle_s", "quiet after the last join before the first plan", unit="ms"),
    Flag(
        "remind_s", "how often the latest plan notice, with the members, is said again", unit="ms"
    ),
    Flag(
        "retire_after_s",
        "a member telemetry calls down leaves the plan once it has been down this long",
        unit="ms",
    ),
    Flag(
        "profile_pace_s",
        "a member's changed profile is planned at most once in this long (the latest wins)",
        unit="ms",
    ),
)


def _cmd_planner(args: argparse.Namespace) -> int:
    from hecate_planner.config import swarm_from_topology
    from hecate_planner.service import PlannerService
    from hecate_planner.strategies import load

    config = config_from(
        args,
        PlannerConfig,
        FLAGS,
        swarm=swarm_from_topology(Path(args.topology).read_bytes(), args.pipelines),
        instance_id=args.id or _instance("planner"),
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
    plan.add_argument(
        "--pipelines",
        type=pipelines,
        default=2,
        help="base replicas, or 'auto': as many as the nodes can form (default 2)",
    )
    plan.add_argument("--strategy", default="greedy", help="planner strategy name")
    add_flags(plan, PlannerConfig, FLAGS)
    plan.set_defaults(run=_cmd_planner)
