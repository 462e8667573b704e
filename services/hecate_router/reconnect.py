"""How long after its own reconnect a router forgives a node's "no responders".

When the router's connection comes back after losing the server, the other clients
are coming back too, each on its own retry schedule: until a node has resubscribed,
NATS answers a stage sent to it with no-responders, which then means "not back yet",
not "gone". A node that really died with the server looks the same, so the forgiveness
must end as soon as what the router has observed says it is no longer deserved.

**The rule.** After the router's reconnect at ``at``, a no-responders from node ``n``
at ``now`` is forgiven (the stage is resent, nobody is blamed) while
``now < closes(n)``, where ``closes(n)`` is ``at + cap`` (the configured
``reconnect_grace_s``, the most any node is ever waited for) lowered by the evidence:

1. ``n`` has answered a stage since ``at``, or telemetry has declared it down since:
   ``at`` (no window: its subscriptions were back, or it is known dead).
2. ``n`` has been heard (a heartbeat) since ``at``, first at ``h``: ``h + floor``.
   A heartbeat proves only its publishing connection; the one that holds its
   subscriptions retries on the same schedule and follows within ``floor``.
3. Every other node expected back (those telemetry called alive at the reconnect) has
   been heard, has answered or was declared down since ``at``, the last back at
   ``at + T``: ``at + max(floor, margin * T)``. The swarm took ``T`` to come back;
   a node not back in ``margin`` times that is taken for dead.

So a node is never given less than ``floor`` unless it answered or was declared down,
never more than ``cap``, and one that died with the server is blamed once the others
are back plus the margin, not at the cap. Evidence from before the latest reconnect is
dropped: it may be of a server since gone. ``floor`` covers the bus clients' retry
period (hecate.bus.connection.connect retries every 0.25 s) and the heartbeat's way through
telemetry. Pure: times are the caller's monotonic clock; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from hecate.wire.messages import TelemetrySnapshot

FLOOR_S = 0.5  # two of the bus clients' reconnect retry periods
MARGIN = 2.0  # a node slower than twice the rest of the swarm is taken for dead


@dataclass(slots=True)
class ReconnectWindow:
    """What the router has observed since its latest reconnect, and the window each
    node is given from it (see the module's rule)."""

    floor_s: float = FLOOR_S
    margin: float = MARGIN
    at: float = float("-inf")  # the router's latest reconnect; -inf: none yet
    expected: frozenset[str] = frozenset()
    heard: dict[str, float] = field(default_factory=dict)  # first heartbeat since `at`
    answered: dict[str, float] = field(default_factory=dict)  # first stage reply since `at`
    down: dict[str, float] = field(default_factory=dict)  # declared down since `at`

    def reconnected(self, now: float, expected: Iterable[str]) -> None:
        """The router's connection came back at ``now``; ``expected`` are the nodes
        that were alive before. Everything heard before is forgotten, also at the
        instant of the previous reconnect (what came between the two is older than this
        one); only an older reconnect, arriving late, changes nothing."""
        if now < self.at:
            return
        self.at = now
        self.expected = frozenset(expected)
        self.heard.clear()
        self.answered.clear()
        self.down.clear()

    def heard_from(self, node_id: str, when: float) -> None:
        """A heartbeat of ``node_id`` at ``when`` (telemetry's word for it)."""
        if when >= self.at:
            self.heard.setdefault(node_id, when)

    def replied(self, node_id: str, when: float) -> None:
        """``node_id`` answered a stage at ``when``: its subscriptions are back."""
        if when >= self.at:
            self.answered.setdefault(node_id, when)

    def declared_down(self, node_id: str, when: float) -> None:
        """Telemetry declared ``node_id`` down at ``when``."""
        if when >= self.at:
            self.down.setdefault(node_id, when)

    def read(self, snap: TelemetrySnapshot, now: float, wall: float, grace_s: float) -> None:
        """Read a telemetry snapshot into the window while it is open (``grace_s`` after
        the reconnect): a heartbeat after the reconnect went through the server as it
        is now, and a node declared down since is not waited for. Telemetry's times are
        its wall clock, compared with ours (``wall`` at ``now``): hosts are assumed to
        keep NTP time."""
        if now - self.at >= grace_s:
            return  # steady state: the window closed and no reconnect since
        wall_back = wall - (now - self.at)
        if snap.written_at <= wall_back:
            return  # written before we were back: says nothing of the server as it is
        for node_id, t in snap.nodes.items():
            if not t.alive:
                self.declared_down(node_id, now)
            elif t.last_seen is not None and t.last_seen > wall_back:
                self.heard_from(node_id, now - (wall - t.last_seen))

    def closes(self, node_id: str, cap_s: float) -> float:
        """When a no-responders from ``node_id`` stops being forgiven."""
        at = self.at
        if node_id in self.answered or node_id in self.down:
            return at
        end = at + cap_s
        if node_id in self.heard:
            end = min(end, self.heard[node_id] + self.floor_s)
        others = self.expected - {node_id}
        if others and others <= (self.heard.keys() | self.answered.keys() | self.down.keys()):
            back = [self._back(n) for n in others if n not in self.down]
            took = max(back, default=at) - at
            end = min(end, at + max(self.floor_s, self.margin * took))
        return end

    def forgives(self, node_id: str, now: float, cap_s: float) -> bool:
        """Whether a no-responders from ``node_id`` at ``now`` may be "not back yet"."""
        return now < self.closes(node_id, cap_s)

    def _back(self, node_id: str) -> float:
        seen = (self.heard.get(node_id), self.answered.get(node_id))
        return min(t for t in seen if t is not None)
