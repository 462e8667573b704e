"""``hecate nats-config``: the ``authorization`` block of nats-server's configuration,
one user per service role and per tenant, with the permissions the wire contract gives
them (see :mod:`hecate.wire.permissions`). ``deploy/nats/auth.conf`` is its output."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hecate.core.errors import HecateError
from hecate.wire import permissions


def _run(args: argparse.Namespace) -> int:
    try:
        text = permissions.render_authorization(tuple(args.tenant) or permissions.DEFAULT_TENANTS)
    except ValueError as exc:
        raise HecateError(str(exc)) from None
    sys.stdout.write(text)
    return 0


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "nats-config",
        help="print nats-server's authorization block: a user per role and per tenant",
    )
    p.add_argument(
        "--tenant",
        action="append",
        default=[],
        metavar="NAME",
        help=f"a tenant user (repeatable; default {', '.join(permissions.DEFAULT_TENANTS)})",
    )
    p.set_defaults(run=_run)
