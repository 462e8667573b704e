"""``hecate router``: a router replica: hecate.infer.<model> -> answers.

Runs until SIGTERM or SIGINT, then drains. Logs are JSON lines on stderr; traces go
to ``OTEL_EXPORTER_OTLP_ENDPOINT`` when it is set.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hecate.cli.process import instance_name as _instance
from hecate.cli.process import run_service, service_parser
from hecate.core import FailoverOptions
from hecate_router.limits import LimitOptions


def _cmd_router(args: argparse.Namespace) -> int:
    from hecate_router.service import RouterConfig, RouterService

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


def add_parser(sub: Any) -> None:
    router = service_parser(sub, "router", "run a router replica: hecate.infer.<model> -> answers")
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
