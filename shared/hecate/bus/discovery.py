"""The NATS service API (ADR-32): what ``$SRV.PING/INFO/STATS`` answer.

Implemented by the shell rather than taken from ``nats.micro``, whose endpoints handle
one request at a time and stop without draining.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from hecate.bus.endpoint import EndpointStats

VERSION = "0.1.0"
VERBS = ("PING", "INFO", "STATS")
# Set by a launcher on a service it started again after it exited (``hecate up``): how
# many times, which every $SRV answer's metadata then says (``hecate status`` lists it).
RESTARTS_ENV = "HECATE_RESTARTS"


def restarted(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``{"restarts": n}`` for a process its launcher started again; else nothing."""
    n = env.get(RESTARTS_ENV, "").strip()
    return {"restarts": n} if n.isdigit() and int(n) > 0 else {}


def subjects(name: str, instance_id: str) -> Iterator[tuple[str, str]]:
    """(verb, subject) for every subject one instance answers: all, by name, by id."""
    for verb in VERBS:
        for subject in (f"$SRV.{verb}", f"$SRV.{verb}.{name}", f"$SRV.{verb}.{name}.{instance_id}"):
            yield verb, subject


def document(
    verb: str,
    *,
    name: str,
    instance_id: str,
    description: str,
    metadata: Mapping[str, str],
    started: str,
    endpoints: Sequence[EndpointStats],
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": name,
        "id": instance_id,
        "version": VERSION,
        "metadata": dict(metadata),
    }
    if verb == "PING":
        doc["type"] = "io.nats.micro.v1.ping_response"
    elif verb == "INFO":
        doc["type"] = "io.nats.micro.v1.info_response"
        doc["description"] = description
        doc["endpoints"] = [
            {
                "name": e.name,
                "subject": e.subject,
                "queue_group": e.queue_group or "",
                "metadata": {},
            }
            for e in endpoints
        ]
    else:
        doc["type"] = "io.nats.micro.v1.stats_response"
        doc["started"] = started
        doc["endpoints"] = [e.as_json() for e in endpoints]
    return doc
