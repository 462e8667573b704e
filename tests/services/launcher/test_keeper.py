"""The keeper's pauses: a service that exits starts again after a pause that doubles
with each exit in a row, never past its cap, and starts over once the service has
stayed up a while; nothing is due before its pause is over, and each is due once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hecate_launcher.keeper import Keeper


def test_exits_in_a_row_double_the_pause_up_to_the_cap() -> None:
    keeper = Keeper(first_s=1.0, most_s=8.0, settled_s=60.0)
    keeper.started("router-1", 0.0)
    now, delays = 0.0, []
    for _ in range(6):
        ex = keeper.exited("router-1", -9, now)
        assert keeper.waiting("router-1")
        assert keeper.due(now + ex.delay_s - 0.01) == []  # not before its pause
        assert [e.label for e in keeper.due(now + ex.delay_s)] == ["router-1"]
        assert keeper.due(now + 1000) == []  # given once
        now += ex.delay_s
        keeper.started("router-1", now)
        delays.append(ex.delay_s)
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert keeper.restarts["router-1"] == 6


def test_a_service_that_stayed_up_a_while_starts_its_pauses_over() -> None:
    keeper = Keeper(first_s=1.0, most_s=30.0, settled_s=60.0)
    keeper.started("node-a", 0.0)
    assert keeper.exited("node-a", 1, 1.0).delay_s == 1.0
    keeper.started("node-a", 2.0)
    assert keeper.exited("node-a", 1, 3.0).delay_s == 2.0
    keeper.started("node-a", 5.0)
    assert keeper.exited("node-a", 1, 65.0).delay_s == 1.0  # up 60 s: a new streak


@given(
    uptimes=st.lists(st.floats(0, 200), min_size=1, max_size=20),
    first=st.floats(0.1, 5),
    most=st.floats(5, 60),
)
def test_a_pause_is_never_below_the_first_nor_above_the_cap(
    uptimes: list[float], first: float, most: float
) -> None:
    keeper = Keeper(first_s=first, most_s=most, settled_s=60.0)
    now = 0.0
    keeper.started("s", now)
    previous = 0.0
    for up in uptimes:
        now += up
        ex = keeper.exited("s", 1, now)
        assert first <= ex.delay_s <= most
        # Within a streak a pause never shrinks; a long run starts it over at first_s.
        assert ex.delay_s >= previous or (up >= 60.0 and ex.delay_s == first)
        previous = ex.delay_s
        now = ex.due
        assert keeper.due(now) == [ex]
        keeper.started("s", now)


def test_two_services_keep_their_own_streaks() -> None:
    keeper = Keeper(first_s=1.0)
    keeper.started("a", 0.0)
    keeper.started("b", 0.0)
    keeper.exited("a", 1, 0.0)
    keeper.started("a", 1.0)
    assert keeper.exited("a", 1, 1.0).delay_s == 2.0
    assert keeper.exited("b", 1, 1.0).delay_s == 1.0
    assert [e.label for e in keeper.due(3.0)] == ["b", "a"]  # oldest due first
