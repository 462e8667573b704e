"""Which telemetry replica speaks for a shard (:mod:`hecate_telemetry.lease`): pure."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hecate.wire.messages import TelemetryLease
from hecate_telemetry.lease import Lease


def test_the_first_replica_creates_the_lease_and_renews_it_in_its_epoch() -> None:
    a = Lease("a", term_s=3.0)
    claim = a.claim(100.0, None, 0)
    assert claim is not None
    assert claim.how == "create"
    assert a.won(claim)  # a new holding: say everything afresh
    assert a.holding(102.9)
    assert not a.holding(103.0)
    renewal = a.claim(101.0, claim.value, 7)
    assert renewal is not None
    assert (renewal.how, renewal.last) == ("update", 7)
    assert renewal.value.epoch == claim.value.epoch
    assert not a.won(renewal)  # the same holding goes on
    assert a.holding(103.5)


def test_a_standby_waits_out_the_holders_term_then_takes_over_in_a_later_epoch() -> None:
    held = TelemetryLease(holder="a", until=103.0, epoch=100.0)
    b = Lease("b", term_s=3.0)
    assert b.claim(102.0, held, 5) is None
    assert not b.holding(102.0)
    assert b.holder == "a"
    takeover = b.claim(103.0, held, 5)
    assert takeover is not None
    assert (takeover.how, takeover.last) == ("update", 5)
    assert takeover.value.epoch > held.epoch
    assert b.won(takeover)
    assert b.takeovers == 1


def test_a_replica_that_lost_the_race_stands_by() -> None:
    b = Lease("b", term_s=3.0)
    claim = b.claim(100.0, None, 0)
    assert claim is not None
    b.lost()
    assert not b.holding(100.0)


def test_a_replica_restarted_under_its_id_speaks_at_once_in_a_new_epoch() -> None:
    before = TelemetryLease(holder="a", until=110.0, epoch=100.0)
    again = Lease("a", term_s=3.0)
    claim = again.claim(105.0, before, 9)
    assert claim is not None
    assert claim.value.epoch > before.epoch
    assert again.won(claim)


@given(st.floats(1.0, 1e9), st.floats(-1e5, 1e5))
def test_a_new_epoch_is_later_than_the_one_before_whatever_the_clocks(
    epoch: float, skew: float
) -> None:
    """A replica whose clock is behind its predecessor's (restarted under its id, so
    it takes over at once) still starts an epoch after the one it replaces: followers
    keep the newest epoch."""
    before = TelemetryLease(holder="a", until=epoch + 3.0, epoch=epoch)
    again = Lease("a", term_s=3.0)
    claim = again.claim(max(0.0, epoch + skew), before, 1)
    assert claim is not None
    assert claim.value.epoch > before.epoch
