"""``hecate router``: a router replica: hecate.infer.<model> -> answers.

Runs until SIGTERM or SIGINT, then drains. Logs are JSON lines on stderr; traces go
to ``OTEL_EXPORTER_OTLP_ENDPOINT`` when it is set. Every setting's type and default is
:class:`~hecate_router.config.RouterConfig`'s; the flags below only say which are
exposed and what they mean (:mod:`hecate.cli.flags`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hecate.cli.flags import Flag, add_flags, config_from
from hecate.cli.process import instance_name as _instance
from hecate.cli.process import run_service, service_parser
from hecate.core import FailoverOptions
from hecate_router.config import RouterConfig

FLAGS = (
    Flag("max_attempts", "stage attempts per request, failovers included"),
    Flag(
        "max_replays",
        "migration limit: how many times a generation is replayed onto a rescue route "
        "(prompt + tokens so far) before it ends with an error carrying its text",
    ),
    Flag("stage_timeout_s", "a stage not answered by then has failed", unit="ms"),
    Flag(
        "route_wait_s",
        "a request in flight left with no route after nodes went silent waits this "
        "long for one to come back (a partition healing) before it is answered "
        "unrecoverable; 0 answers at once",
        unit="ms",
    ),
    Flag("max_request_bytes", "a larger request is refused as too_large"),
    Flag(
        "prefix_cache",
        "a generation's nodes start it from the longest prefix of its prompt they keep "
        "cached for the same tenant, and requests are routed towards where theirs is",
    ),
    Flag(
        "run_ahead",
        "with --dispatch chain, a long prompt's first stage runs its chunks one after "
        "another and forwards each as it is run, so that several stages compute at "
        "once (off: the router sends each chunk once the one before has left the last "
        "stage, as nodes before this option need)",
    ),
    Flag(
        "enforce_quotas",
        "admit each request through the shared tenant quota desk (breaker service)",
    ),
    Flag(
        "tenant_from",
        "bus: a request's tenant is the NATS account the server vouches for (a bus "
        "with one account per tenant), and a body naming another is refused; body: the "
        "request's own tenant field, unauthenticated (development)",
    ),
    Flag(
        "quota_timeout_s",
        "a request the quota desk has not answered by then is served, and counted",
        unit="ms",
    ),
    Flag(
        "breaker_probe_timeout_s",
        "a probe lease not used by then may be taken by another router "
        "(keep equal to the breaker service's --probe-timeout-s)",
    ),
    Flag(
        "stale_s", "telemetry older than this is reported stale in the router's status", unit="ms"
    ),
    Flag(
        "dispatch",
        "hop: the router calls each stage (keeps activations, resumes failover "
        "mid-route); chain: nodes forward to each other (fewer messages, failover "
        "restarts the route)",
    ),
    Flag(
        "limits.gain",
        "admission: a pipeline may carry this many times the requests it can hold "
        "before it queues (its best measured throughput times its best step time)",
        name="--limit-gain",
    ),
    Flag("limits.ceiling", "admission: most requests per pipeline", name="--limit-ceiling"),
    Flag(
        "queue_limit",
        "requests that may wait per model when every pipeline is at its limit; "
        "past it, rate_limited with a Retry-After",
    ),
    Flag(
        "queue_timeout_s",
        "the least a request waits for room before it is refused as rate_limited "
        "(and its wait before any request has finished); past it, what the line ahead "
        "needs at the measured finishing rate",
        unit="ms",
    ),
    Flag("queue_max_wait_s", "the most a request waits for room, whatever the line", unit="ms"),
)


def _cmd_router(args: argparse.Namespace) -> int:
    from hecate_router.service import RouterService

    failover = FailoverOptions(allow_degraded=args.allow_degraded, reserve_model=args.reserve_model)
    if args.topology:
        from hecate.sim.topology import parse_topology

        failover = parse_topology(Path(args.topology).read_bytes()).failover_options()
    instance = args.id or _instance("router")
    config = config_from(args, RouterConfig, FLAGS, instance_id=instance, failover=failover)
    return run_service(
        "router",
        instance,
        args.nats,
        lambda log, tp: RouterService(config, log=log, tracer_provider=tp),
    )


def add_parser(sub: Any) -> None:
    router = service_parser(sub, "router", "run a router replica: hecate.infer.<model> -> answers")
    router.add_argument("--id", default=None)
    router.add_argument("--topology", default=None, help="read failover options from here")
    router.add_argument("--allow-degraded", action="store_true")
    router.add_argument("--reserve-model", default=None)
    add_flags(router, RouterConfig, FLAGS)
    router.set_defaults(run=_cmd_router)
