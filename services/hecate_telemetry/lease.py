"""Which of a shard's telemetry replicas speaks for it: a lease in KV.

Several replicas may run for one shard: each hears the same intake partitions and
judges every node silently, and only the one holding the shard's lease
(``hecate-telemetry/lease.<shard>``) publishes node events, deltas and snapshots. The
holder renews the lease every third of its term; a standby takes it over once its term
has passed unrenewed (its holder dead, frozen or cut off), with a compare-and-set on
the revision it read, so two standbys never both win. Its failure detector was warm
all along: nodes keep their histories and nobody is called down for the takeover.

A holder that cannot renew (the bus away) stops speaking when its term ends, whether
or not anyone took over: two replicas speak for one shard at most until the old term
ends. Followers tell them apart meanwhile by their epochs (a new holder starts a new
one, later than its predecessor's), and keep the newest.

Pure: the service reads the key, asks :meth:`Lease.claim` what to write, writes it and
reports back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hecate.wire.messages import TelemetryLease


@dataclass(frozen=True, slots=True)
class Claim:
    """Write ``value`` to the lease key: ``create`` it (nobody holds it) or ``update``
    it on revision ``last``."""

    how: Literal["create", "update"]
    value: TelemetryLease
    last: int = 0


class Lease:
    """One replica's view of its shard's lease, on wall-clock time (the replicas'
    hosts are assumed to keep NTP time, as everywhere in HECATE)."""

    def __init__(self, me: str, term_s: float) -> None:
        self.me, self.term_s = me, term_s
        self.until = 0.0  # our own term's end, while we hold the lease
        self.epoch = 0.0  # our epoch as holder: when we took the lease
        self.holder: str | None = None  # who held it when we last read it
        self.takeovers = 0

    def holding(self, now: float) -> bool:
        """Whether this replica speaks for the shard now."""
        return now < self.until

    def claim(self, now: float, read: TelemetryLease | None, revision: int) -> Claim | None:
        """What to write, having read ``read`` at ``revision`` (None: no lease yet):
        a renewal of ours, a takeover of one whose term passed, or nothing while
        another replica's term runs."""
        self.holder = read.holder if read is not None else None
        if read is None:
            return Claim("create", self._next(now, fresh=True, after=0.0))
        if read.holder == self.me and read.epoch == self.epoch and self.epoch > 0:
            return Claim("update", self._next(now, fresh=False, after=read.epoch), revision)
        # Ours from a run before this one (a replica restarted under its id), or a term
        # that passed unrenewed: taken over.
        if read.holder == self.me or read.until <= now:
            return Claim("update", self._next(now, fresh=True, after=read.epoch), revision)
        self.until = 0.0  # someone else's term: we are a standby
        return None

    def _next(self, now: float, *, fresh: bool, after: float) -> TelemetryLease:
        """Our lease from ``now``: a fresh holding's epoch is later than every epoch
        before it, whatever the clocks of the hosts that held it."""
        epoch = max(now, after + 0.001, self.epoch + 0.001) if fresh else self.epoch
        return TelemetryLease(holder=self.me, until=now + self.term_s, epoch=epoch)

    def won(self, claim: Claim) -> bool:
        """``claim`` was written: we hold the lease until its term ends. True when this
        starts a new holding (a new epoch: say everything afresh)."""
        fresh = claim.value.epoch != self.epoch
        self.epoch, self.until = claim.value.epoch, claim.value.until
        self.holder = self.me
        if fresh:
            self.takeovers += 1
        return fresh

    def lost(self) -> None:
        """``claim`` was refused (another replica wrote first): a standby until the
        next read says otherwise."""
        self.until = 0.0
