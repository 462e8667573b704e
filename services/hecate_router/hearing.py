"""Whether a stage's silence is the node's or the router's own.

A stage that times out says "nobody answered", not who failed. When the router's own
link goes silent (a half-open connection: its server cut off, alive and mute), every
stage it sends times out, and blaming each node in turn spends the request's attempts
on the router's link. What tells the two apart is everything else the router hears:
a live router on a live bus hears a stage reply from some node, a telemetry snapshot
(written every 100 ms while nodes beat) or a node-down verdict all the time; a router
whose link is held hears nothing at all.

**The rule.** A stage sent at ``sent`` that timed out at ``now`` is the router's
isolation, not the node's fault, when

1. the router's connection came back since ``sent``: the stage, or its answer, may
   have gone with the old link; or
2. the router heard nothing at all over its connection for the last ``quiet_s``;

and a stage that never left the router (its publish failed) is its own link's too.

Then nobody is blamed, suspected or reported, the attempt is not counted, and the
same stage is sent again. It is bounded: a flight is excused for at most ``limit_s``
after its first excused timeout (a stage reply starts it afresh). Past that the router
can no longer tell its own deafness from a node's death in a silent swarm (telemetry
down and one request in flight, say), so it fails over as it would have; and should
that end with no route while it still hears nobody, the caller is told the router is
cut off (``timeout``, which a client retries elsewhere), never ``unrecoverable``.

A frozen or blackholed *node* never looks like this while anything else is alive: the
other flights' replies and telemetry's snapshots keep coming, and telemetry declares
it down. Pure: times are the caller's monotonic clock; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from hecate_router.flow import Failure


@dataclass(slots=True)
class Hearing:
    """When the router last heard anything over its connection (any stage reply or
    status on its inbox, a telemetry snapshot, a node-down verdict)."""

    last: float | None = None  # None: nobody feeds it, so it says nothing

    def heard(self, when: float) -> None:
        if self.last is None or when > self.last:
            self.last = when

    def deaf(self, now: float, quiet_s: float) -> bool:
        """Whether nothing at all has come in for the last ``quiet_s``."""
        return self.last is not None and now - self.last >= quiet_s


def isolated(
    why: Failure,
    hearing: Hearing,
    *,
    reconnected_at: float,
    sent: float,
    now: float,
    quiet_s: float,
) -> str | None:
    """Why the failure of a stage sent at ``sent`` is the router's own isolation (the
    rule's 1 and 2, or a publish that failed), or ``None``: it may be the node's."""
    if why.kind == "publish_failed":
        return f"the stage never left the router ({why.reason})"
    if why.kind != "timeout":
        return None  # an answer, a status or a verdict came in: the link works
    if reconnected_at > sent:
        return "the router's connection came back since the stage was sent"
    if hearing.last is not None and hearing.deaf(now, quiet_s):
        return f"the router heard nothing at all for {now - hearing.last:.1f} s"
    return None
