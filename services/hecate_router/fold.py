"""What telemetry says of each node, in the terms the chooser decides on."""

from __future__ import annotations

from collections.abc import Mapping

from hecate.core.telemetry import NodeState
from hecate.wire.messages import NodeTelemetry


def telemetry_nodes(
    seen: Mapping[str, NodeTelemetry],
) -> tuple[dict[str, NodeState], dict[str, float]]:
    """Each reported node's state, and when telemetry last heard from those it calls
    alive. A draining node takes no new work, but it was heard from: a suspicion of it
    is cleared all the same."""
    nodes = {
        node_id: NodeState(
            alive=t.alive and not t.draining,
            latency_ms=t.latency_ms,
            load=t.load,
            score=t.score,
            last_seen=t.last_seen,
            in_flight=t.in_flight,
        )
        for node_id, t in seen.items()
    }
    heard = {node_id: t.last_seen or 0.0 for node_id, t in seen.items() if t.alive}
    return nodes, heard
