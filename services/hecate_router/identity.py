"""Who is asking: the tenant a request acts for, from what the bus vouches for.

When a tenant's NATS account imports the swarm's ``hecate.infer.>`` (and
``hecate.stream.>``), the server stamps
each request crossing the import with a ``Nats-Request-Info`` header naming the
requesting account (``{"acc": ...}``), over whatever header the client sent
(tests/shared/bus/test_bus_identity.py shows it on a real server). A tenant's account
is named after the tenant. So:

* ``bus``: the tenant is the account the server names. A request that names another
  tenant in its body is refused, and so is one that crossed no import (the server
  vouched for no account).
* ``body``: the open, development bus: the body's ``tenant`` field, unauthenticated.

Pure: the router hands in the headers and the body's field, and gets a tenant or a
refusal it answers with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import msgspec

TenantSource = Literal["body", "bus"]
REQUEST_INFO = "Nats-Request-Info"
# What a body that names no tenant carries (InferRequest's default).
UNNAMED: frozenset[str] = frozenset({"", "default"})


@dataclass(frozen=True, slots=True)
class Refused:
    """The request is answered ``forbidden`` with this message."""

    message: str
    vouched: str | None  # the account the server named, for the log line


class _RequestInfo(msgspec.Struct):
    """The one field of the server's stamp this reads (it writes a dozen: decoding
    only this one is what keeps the check off a router's profile)."""

    acc: str = ""


_request_info = msgspec.json.Decoder(_RequestInfo)


def vouched_account(headers: Mapping[str, str]) -> str | None:
    """The account the server stamped, or None when the request crossed no import (or
    the header does not read as the server writes it)."""
    raw = headers.get(REQUEST_INFO)
    if raw is None:
        return None
    try:
        acc = _request_info.decode(raw).acc
    except msgspec.DecodeError:
        return None
    return acc or None


def tenant_of(source: TenantSource, headers: Mapping[str, str], named: str) -> str | Refused:
    """The tenant a request acts for, or why it is refused. ``named``: its body's
    ``tenant`` field."""
    if source == "body":
        return named
    vouched = vouched_account(headers)
    if vouched is None:
        return Refused(
            "no tenant account vouched for this request: ask through a tenant account", None
        )
    if named not in UNNAMED and named != vouched:
        return Refused(
            f"the request names tenant {named!r}, but it comes from tenant {vouched!r}", vouched
        )
    return vouched
