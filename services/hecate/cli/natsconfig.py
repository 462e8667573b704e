"""``hecate nats-config``: the ``authorization`` block of nats-server's configuration,
one user per service role and per tenant, with the permissions the wire contract gives
them (see :mod:`hecate.wire.permissions`). ``deploy/nats/auth.conf`` is its output."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hecate.wire import permissions


def _run(args: argparse.Namespace) -> int:
    sys.stdout.write(permissions.render_authorization(tenants(args)))
    return 0


def _tenant(text: str) -> str:
    try:
        permissions.users((text,))
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


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "nats-config",
        help="print nats-server's authorization block: a user per role and per tenant",
    )
    add_tenant_option(p, "a tenant user")
    p.set_defaults(run=_run)
