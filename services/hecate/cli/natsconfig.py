"""``hecate nats-config``: the ``authorization`` block of nats-server's configuration,
one user per service role, per node and per tenant, with the permissions the wire
contract gives them (see :mod:`hecate.wire.permissions`). ``deploy/nats/auth.conf`` is
its output for the nodes of ``examples/swarm.json`` (those docker-compose runs).

With ``--accounts``, the same users in an ``accounts`` block instead: the services in
one account and each tenant in its own, so the server vouches for a request's tenant
(``deploy/nats/accounts.conf``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hecate.wire import permissions


def _run(args: argparse.Namespace) -> int:
    try:
        chosen = nodes(args)
        render = permissions.render_accounts if args.accounts else permissions.render_authorization
        text = render(tenants(args), chosen)
    except ValueError as exc:  # a node listed twice (a bad topology: main says why)
        sys.stderr.write(f"hecate nats-config: {exc}\n")
        return 2
    sys.stdout.write(text)
    return 0


def _tenant(text: str) -> str:
    try:
        permissions.users((text,), ())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _node(text: str) -> str:
    try:
        permissions.node_permissions(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_tenant_option(p: argparse.ArgumentParser, purpose: str) -> None:
    """``--tenant NAME`` (repeatable), checked as it is parsed; read it with :func:`tenants`."""
    p.add_argument(
        "--tenant",
        action="append",
        default=[],
        type=_tenant,
        metavar="NAME",
        help=f"{purpose} (repeatable; default {', '.join(permissions.DEFAULT_TENANTS)})",
    )


def tenants(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(args.tenant) or permissions.DEFAULT_TENANTS


def nodes(args: argparse.Namespace) -> tuple[str, ...]:
    """The node ids given (``--node``), then those of ``--topology``'s nodes; the
    nodes of examples/swarm.json when neither is."""
    found = list(args.node)
    if args.topology is not None:
        from hecate.sim.topology import parse_topology

        found += [n.id for n in parse_topology(Path(args.topology).read_bytes()).nodes]
    return tuple(found) if found else permissions.DEFAULT_NODES


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "nats-config",
        help="print nats-server's authorization block: a user per role, node and tenant",
    )
    add_tenant_option(p, "a tenant user")
    p.add_argument(
        "--node",
        action="append",
        default=[],
        type=_node,
        metavar="ID",
        help="a node user, node-ID, that may speak only as node ID (repeatable)",
    )
    p.add_argument(
        "--topology",
        metavar="FILE",
        default=None,
        help="a node user for each node of this topology file "
        f"(default, without --node: {', '.join(permissions.DEFAULT_NODES)})",
    )
    p.add_argument(
        "--accounts",
        action="store_true",
        help="print an accounts block instead: the services in one account and one account "
        "per tenant importing what tenants send on, so the server names each request's "
        "tenant (routers run --tenant-from bus)",
    )
    p.set_defaults(run=_run)
