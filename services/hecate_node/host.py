"""``hecate node-host``: many node identities in one process, for swarms larger than a
machine holds as one process a node (simulations, tests, benchmarks).

Each identity is a whole :class:`~hecate_node.service.Node`, as ``hecate node`` runs
it: its own two connections, its own subjects (``hecate.node.<id>.*``), heartbeats,
plan holdings and executor; they share only the process and its event loop. So
everything the swarm does with them goes through the production code paths; only the
cost of a process per node is saved (about 48 MB each here).

The identities run in one task group: one whose background loop fails stops them all,
and the process exits nonzero (its supervisor restarts it), as one node process would.
On SIGTERM every identity drains and leaves. They start ``start_per_s`` a second, not
all at once: thousands of connections opened in the same instant (two an identity)
overran one nats-server on two cores, and identities that could not connect within
their 10 s took their hosts down.

Not on the locked-down bus yet: there each node is a NATS user of its own, and one
process would need the credentials of every identity it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from opentelemetry.trace import TracerProvider

from hecate.cli.flags import add_flags, config_from
from hecate.cli.process import run_service, service_parser
from hecate.core import HecateError, NodeProfile
from hecate_node.cli import FLAGS, PROFILE_FLAGS
from hecate_node.config import NodeConfig
from hecate_node.service import Node


class IdentityFailed(HecateError):
    """One identity of a node host failed (a background loop of it raised)."""

    code = "internal"


class NodeHost:
    def __init__(
        self,
        configs: Sequence[NodeConfig],
        *,
        log: logging.Logger,
        tracer_provider: TracerProvider | None = None,
        start_per_s: float = 200.0,
    ) -> None:
        ids = [c.profile.node_id for c in configs]
        if len(set(ids)) != len(ids):
            raise HecateError("a node host's identities must have distinct ids")
        self.log = log
        self.start_per_s = start_per_s
        self.nodes = [Node(c, log=log, tracer_provider=tracer_provider) for c in configs]

    async def run(self, url: str, stop: asyncio.Event, grace: float = 10.0) -> None:
        async with asyncio.TaskGroup() as group:
            for i, node in enumerate(self.nodes):
                after = i / self.start_per_s
                group.create_task(
                    self._one(node, url, stop, grace, after), name=node.profile.node_id
                )

    @staticmethod
    async def _one(node: Node, url: str, stop: asyncio.Event, grace: float, after: float) -> None:
        if after > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), after)
            if stop.is_set():
                return  # stopped before its turn to start
        try:
            await node.run(url, stop, grace)
        except asyncio.CancelledError:
            failure = node.service.failure
            if failure is None:
                raise  # the group's own cancel: another identity failed, or the host stops
            # The node's shell cancelled the task that started it: say which, as an
            # error, so that the group stops the others and the process exits nonzero.
            raise IdentityFailed(f"node {node.profile.node_id}: {failure}") from None


def identities(prefix: str, count: int) -> list[str]:
    """``count`` node ids: ``prefix`` and a number, zero-padded so that they sort."""
    width = len(str(count - 1))
    return [f"{prefix}{i:0{width}d}" for i in range(count)]


def _cmd_node_host(args: argparse.Namespace) -> int:
    configs = []
    for node_id in identities(args.prefix, args.count):
        profile = config_from(
            args, NodeProfile, PROFILE_FLAGS, node_id=node_id, capacity_layers=args.capacity_layers
        )
        configs.append(config_from(args, NodeConfig, FLAGS, profile=profile))
    return run_service(
        "node-host",
        args.prefix,
        args.nats,
        lambda log, tp: NodeHost(
            configs, log=log, tracer_provider=tp, start_per_s=args.start_per_s
        ),
    )


def add_parser(sub: Any) -> None:
    host = service_parser(
        sub, "node-host", "run many node identities in one process (simulations, tests)"
    )
    host.add_argument("--prefix", required=True, help="node ids: PREFIX0, PREFIX1, ...")
    host.add_argument("--count", type=int, required=True, help="how many identities")
    host.add_argument("--capacity-layers", type=int, required=True, help="each identity's")
    host.add_argument(
        "--start-per-s",
        type=float,
        default=200.0,
        help="identities started a second (default 200): not every connection at once",
    )
    add_flags(host, NodeProfile, PROFILE_FLAGS)
    add_flags(host, NodeConfig, FLAGS)
    host.set_defaults(run=_cmd_node_host)
