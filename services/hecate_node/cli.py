"""``hecate node``: a node: host layer ranges, execute them, send heartbeats.

Runs until SIGTERM or SIGINT, then drains. Logs are JSON lines on stderr; traces go
to ``OTEL_EXPORTER_OTLP_ENDPOINT`` when it is set.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from hecate.cli.flags import Flag, add_flags, config_from
from hecate.cli.process import run_service, service_parser
from hecate.core import HecateError, NodeProfile
from hecate_node.config import NodeConfig

# Types and defaults are NodeProfile's and NodeConfig's (hecate.cli.flags).
PROFILE_FLAGS = (
    Flag("latency_ms", "declared latency"),
    Flag("score", "declared capability score"),
)
FLAGS = (
    Flag("executor", "what computes the node's ranges (hecate model add names more)"),
    Flag("heartbeat_s", "how often the node reports to telemetry", unit="ms"),
    Flag(
        "heartbeat_budget_per_s",
        "the whole swarm's heartbeats a second: past it (the plan says how many nodes "
        "beat), each node beats more slowly",
    ),
    Flag("heartbeat_most_s", "the slowest a node beats however large the swarm", unit="ms"),
    Flag(
        "accept_faults",
        "listen on hecate.node.<id>.fault for injected delays and errors "
        "(chaos runs only; never in production)",
    ),
)


def memory_size(text: str) -> int:
    """``--memory``'s parser: argparse shows a refusal's message."""
    from hecate_node.memory import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cmd_node(args: argparse.Namespace) -> int:
    from hecate.model import Executor
    from hecate_node.service import Node

    executor: Executor | None = None
    if args.executor == "upstream":
        from hecate_node.upstream import UpstreamModel

        if not args.upstream_url or not args.upstream_model:
            raise HecateError("--executor upstream needs --upstream-url and --upstream-model")
        key = os.environ.get(args.upstream_key_env) if args.upstream_key_env else None
        executor = UpstreamModel(args.upstream_url, args.upstream_model, api_key=key)
    capacity = args.capacity_layers
    profile = config_from(
        args, NodeProfile, PROFILE_FLAGS, node_id=args.id, capacity_layers=capacity or 0
    )
    config = config_from(
        args,
        NodeConfig,
        FLAGS,
        profile=profile,
        memory=args.memory,
        capacity_from_memory=capacity is None,
    )
    return run_service(
        "node",
        args.id,
        args.nats,
        lambda log, tp: Node(config, log=log, tracer_provider=tp, executor=executor),
    )


def add_parser(sub: Any) -> None:
    node = service_parser(
        sub, "node", "run a node: host layer ranges, execute them, send heartbeats"
    )
    node.add_argument("--id", required=True, help="node id (a slug)")
    node.add_argument(
        "--capacity-layers",
        type=int,
        default=None,
        help="the most layers the node holds (default: what fits its memory, for an "
        "executor that can say what its layers cost; required for the others)",
    )
    node.add_argument(
        "--memory",
        type=memory_size,
        default=None,
        help="the memory the node may use, e.g. 2G or 1536M (default: its cgroup's "
        "limit, else what the machine has available as it starts)",
    )
    add_flags(node, NodeProfile, PROFILE_FLAGS)
    add_flags(node, NodeConfig, FLAGS)
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
