"""``hecate planner|telemetry|router|node|breaker``: one service per process.

Each runs until SIGTERM or SIGINT, then drains. Logs are JSON lines on stderr; traces go
to ``OTEL_EXPORTER_OTLP_ENDPOINT`` when it is set.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from hecate.cli.process import DEFAULT_URL, Runnable, default_url, run_loop, run_service
from hecate.cli.process import instance_name as _instance
from hecate.core import FailoverOptions, HecateError, NodeProfile
from hecate.core.admission import LimitOptions

__all__ = ["DEFAULT_URL", "Runnable", "add_parsers", "default_url", "run_loop", "run_service"]


def _cmd_node(args: argparse.Namespace) -> int:
    from hecate.model import Executor
    from hecate.services.node import Node
    from hecate.services.node_config import NodeConfig

    executor: Executor | None = None
    if args.executor == "upstream":
        from hecate.services.upstream import UpstreamModel

        if not args.upstream_url or not args.upstream_model:
            raise HecateError("--executor upstream needs --upstream-url and --upstream-model")
        key = os.environ.get(args.upstream_key_env) if args.upstream_key_env else None
        executor = UpstreamModel(args.upstream_url, args.upstream_model, api_key=key)
    config = NodeConfig(
        profile=NodeProfile(
            node_id=args.id,
            capacity_layers=args.capacity_layers,
            latency_ms=args.latency_ms,
            score=args.score,
        ),
        executor=args.executor,
        heartbeat_s=args.heartbeat_ms / 1000,
        accept_faults=args.accept_faults,
    )
    return run_service(
        "node",
        args.id,
        args.nats,
        lambda log, tp: Node(config, log=log, tracer_provider=tp, executor=executor),
    )


def _cmd_telemetry(args: argparse.Namespace) -> int:
    from hecate.services.config import TelemetryConfig
    from hecate.services.telemetry import Telemetry

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


def _cmd_planner(args: argparse.Namespace) -> int:
    from hecate.services.config import PlannerConfig, swarm_from_topology
    from hecate.services.planner import PlannerService
    from hecate.services.strategies import load

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


def _cmd_router(args: argparse.Namespace) -> int:
    from hecate.services.router import RouterConfig, RouterService

    failover = FailoverOptions(allow_degraded=args.allow_degraded, reserve_model=args.reserve_model)
    if args.topology:
        from hecate.sim.topology import parse_topology

        failover = parse_topology(Path(args.topology).read_bytes()).failover_options()
    instance = args.id or _instance("router")
    return run_service(
        "router",
        instance,
        args.nats,
        lambda log, tp: RouterService(
            RouterConfig(
                instance_id=instance,
                failover=failover,
                max_attempts=args.max_attempts,
                max_replays=args.max_replays,
                stage_timeout_s=args.stage_timeout_ms / 1000,
                route_wait_s=args.route_wait_ms / 1000,
                max_request_bytes=args.max_request_bytes,
                dispatch=args.dispatch,
                stale_s=args.stale_ms / 1000,
                limits=LimitOptions(gain=args.limit_gain, ceiling=args.limit_ceiling),
                queue_limit=args.queue_limit,
                queue_timeout_s=args.queue_timeout_ms / 1000,
                queue_max_wait_s=args.queue_max_wait_ms / 1000,
                breaker_probe_timeout_s=args.breaker_probe_timeout_s,
                enforce_quotas=args.enforce_quotas,
                tenant_from=args.tenant_from,
                quota_timeout_s=args.quota_timeout_ms / 1000,
            ),
            log=log,
            tracer_provider=tp,
        ),
    )


def _cmd_breaker(args: argparse.Namespace) -> int:
    from hecate.services.breaker import BreakerService
    from hecate.services.config import BreakerConfig
    from hecate.services.quotas import load_quotas

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


def add_parsers(sub: Any) -> None:
    def service(name: str, help_: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_)
        p.add_argument(
            "--nats", default=default_url(), help="NATS server URL (comma-separated: a cluster)"
        )
        return p

    node = service("node", "run a node: host layer ranges, execute them, send heartbeats")
    node.add_argument("--id", required=True, help="node id (a slug)")
    node.add_argument("--capacity-layers", type=int, required=True)
    node.add_argument("--latency-ms", type=float, default=0.0, help="declared latency")
    node.add_argument("--score", type=float, default=1.0, help="declared capability score")
    node.add_argument("--executor", default="toy", help="layer executor (default toy)")
    node.add_argument("--heartbeat-ms", type=float, default=100.0)
    node.add_argument(
        "--accept-faults",
        action="store_true",
        help="listen on hecate.node.<id>.fault for injected delays and errors "
        "(chaos runs only; never in production)",
    )
    node.add_argument(
        "--upstream-url",
        default=None,
        help="with --executor upstream: the OpenAI-compatible base URL",
    )
    node.add_argument(
        "--upstream-model", default=None, help="with --executor upstream: the provider's model name"
    )
    node.add_argument(
        "--upstream-key-env",
        default=None,
        help="with --executor upstream: the environment variable holding the key",
    )
    node.set_defaults(run=_cmd_node)

    tel = service("telemetry", "run the telemetry service: heartbeats -> liveness, snapshot")
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

    plan = service("planner", "run the planner: membership -> plan in KV")
    plan.add_argument("--id", default=None)
    plan.add_argument("--topology", required=True, help="models and failover (nodes join)")
    plan.add_argument("--pipelines", type=int, default=None, help="base replicas (default 2)")
    plan.add_argument("--strategy", default="greedy", help="planner strategy name")
    plan.add_argument("--settle-ms", type=float, default=500.0)
    plan.set_defaults(run=_cmd_planner)

    router = service("router", "run a router replica: hecate.infer.<model> -> answers")
    router.add_argument("--id", default=None)
    router.add_argument("--topology", default=None, help="read failover options from here")
    router.add_argument("--allow-degraded", action="store_true")
    router.add_argument("--reserve-model", default=None)
    router.add_argument(
        "--max-attempts", type=int, default=3, help="stage attempts per request, failovers included"
    )
    router.add_argument(
        "--max-replays",
        type=int,
        default=2,
        help="migration limit: how many times a generation is replayed onto a rescue route "
        "(prompt + tokens so far) before it ends with an error carrying its text",
    )
    router.add_argument("--stage-timeout-ms", type=float, default=2000.0)
    router.add_argument(
        "--route-wait-ms",
        type=float,
        default=5000.0,
        help="a request in flight left with no route after nodes went silent waits this "
        "long for one to come back (a partition healing) before it is answered "
        "unrecoverable; 0 answers at once",
    )
    router.add_argument("--max-request-bytes", type=int, default=256 * 1024)
    router.add_argument(
        "--enforce-quotas",
        action="store_true",
        help="admit each request through the shared tenant quota desk (breaker service)",
    )
    router.add_argument(
        "--tenant-from",
        choices=("body", "bus"),
        default="body",
        help="bus: a request's tenant is the NATS account the server vouches for (a bus "
        "with one account per tenant), and a body naming another is refused; body: the "
        "request's own tenant field, unauthenticated (development)",
    )
    router.add_argument(
        "--quota-timeout-ms",
        type=float,
        default=1000.0,
        help="a request the quota desk has not answered by then is served, and counted",
    )
    router.add_argument(
        "--breaker-probe-timeout-s",
        type=float,
        default=10.0,
        help="a probe lease not used by then may be taken by another router "
        "(keep equal to the breaker service's --probe-timeout-s)",
    )
    router.add_argument(
        "--stale-ms",
        type=float,
        default=2000.0,
        help="telemetry older than this is reported stale in the router's status",
    )
    router.add_argument(
        "--dispatch",
        choices=["hop", "chain"],
        default="hop",
        help="hop: the router calls each stage (keeps activations, resumes "
        "failover mid-route); chain: nodes forward to each other (fewer "
        "messages, failover restarts the route)",
    )
    router.add_argument(
        "--limit-gain",
        type=float,
        default=2.0,
        help="admission: a pipeline may carry this many times the requests it can hold "
        "before it queues (its best measured throughput times its best step time)",
    )
    router.add_argument(
        "--limit-ceiling", type=float, default=64.0, help="admission: most requests per pipeline"
    )
    router.add_argument(
        "--queue-limit",
        type=int,
        default=1024,
        help="requests that may wait per model when every pipeline is at its limit; "
        "past it, rate_limited with a Retry-After",
    )
    router.add_argument(
        "--queue-timeout-ms",
        type=float,
        default=5000.0,
        help="the least a request waits for room before it is refused as rate_limited "
        "(and its wait before any request has finished); past it, what the line ahead "
        "needs at the measured finishing rate (default 5000)",
    )
    router.add_argument(
        "--queue-max-wait-ms",
        type=float,
        default=60000.0,
        help="the most a request waits for room, whatever the line (default 60000)",
    )
    router.set_defaults(run=_cmd_router)

    breaker = service("breaker", "run the breaker service: shared circuit breakers in KV")
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
