"""The reconnect window alone: over any sequence of what a router observes (its own
reconnects, heartbeats, stage replies, nodes declared down), a no-responders is forgiven
no longer than the cap, never for a node known back or dead, and for a node not yet
back until the cap or until the rest of the swarm's return closes it."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import example, given
from hypothesis import strategies as st

from hecate_router.reconnect import ReconnectWindow

NODES = ("a", "b", "c", "d")
CAP = 3.0
KINDS = ("reconnect", "heard", "replied", "down")


@dataclass(frozen=True)
class Seen:
    kind: str
    node: str
    dt: float  # after the previous observation
    expected: frozenset[str]


seen = st.builds(
    Seen,
    kind=st.sampled_from(KINDS),
    node=st.sampled_from(NODES),
    dt=st.floats(0, 1.5),
    expected=st.frozensets(st.sampled_from(NODES)),
)


def play(events: list[Seen]) -> tuple[ReconnectWindow, float, list[tuple[str, str, float]]]:
    """The window after ``events``, the clock, and what it saw since its last reconnect."""
    w, now = ReconnectWindow(), 0.0
    since: list[tuple[str, str, float]] = []
    for e in events:
        now += e.dt
        if e.kind == "reconnect":
            w.reconnected(now, e.expected)
            since = [] if w.at == now else since
        else:
            getattr(w, {"heard": "heard_from", "down": "declared_down"}.get(e.kind, e.kind))(
                e.node, now
            )
            since.append((e.kind, e.node, now))
    return w, now, since


@given(events=st.lists(seen, max_size=30), node=st.sampled_from(NODES), later=st.floats(0, 5))
def test_the_window_never_outlasts_the_cap(events: list[Seen], node: str, later: float) -> None:
    w, now, _ = play(events)
    assert w.closes(node, CAP) <= w.at + CAP
    if now + later >= w.at + CAP:
        assert not w.forgives(node, now + later, CAP)


@given(events=st.lists(seen, max_size=30), node=st.sampled_from(NODES), later=st.floats(0, 5))
def test_a_node_that_answered_or_was_declared_down_since_is_never_forgiven(
    events: list[Seen], node: str, later: float
) -> None:
    w, now, since = play(events)
    if any(k in ("replied", "down") and n == node for k, n, _ in since):
        assert not w.forgives(node, now + later, CAP)


@given(events=st.lists(seen, max_size=30), node=st.sampled_from(NODES))
def test_a_node_heard_since_is_forgiven_at_most_the_floor_after(
    events: list[Seen], node: str
) -> None:
    w, _now, since = play(events)
    heard = [t for k, n, t in since if k == "heard" and n == node]
    if heard:
        assert w.closes(node, CAP) <= heard[0] + w.floor_s


@given(events=st.lists(seen, max_size=30), node=st.sampled_from(NODES))
@example(  # a reconnect at the instant of the previous one forgets what came between
    events=[
        Seen("reconnect", "a", 0.0, frozenset()),
        Seen("heard", "a", 0.0, frozenset()),
        Seen("reconnect", "a", 0.0, frozenset()),
    ],
    node="a",
)
def test_a_node_not_back_is_forgiven_until_the_cap_while_others_are_missing_too(
    events: list[Seen], node: str
) -> None:
    w, _now, since = play(events)
    if w.at == float("-inf"):
        return
    back = {n for _k, n, _t in since}
    if node in back:
        return
    # Never blamed sooner than the floor: its reconnect may just be a retry away.
    assert w.closes(node, CAP) >= w.at + w.floor_s
    if (w.expected - {node}) - back or not (w.expected - {node}):
        assert w.closes(node, CAP) == w.at + CAP  # no evidence closes it: the cap


@given(events=st.lists(seen, max_size=30), node=st.sampled_from(NODES))
def test_a_node_that_died_with_the_server_is_blamed_once_the_others_are_back(
    events: list[Seen], node: str
) -> None:
    w, _now, since = play(events)
    others = w.expected - {node}
    if w.at == float("-inf") or not others or any(n == node for _k, n, _t in since):
        return
    first: dict[str, float] = {}
    for _k, n, t in since:
        first.setdefault(n, t)
    if others <= first.keys():
        took = max(first[n] for n in others) - w.at
        assert w.closes(node, CAP) <= w.at + max(w.floor_s, w.margin * took)


@given(
    events=st.lists(seen, max_size=30),
    more=st.lists(seen.filter(lambda e: e.kind != "reconnect"), max_size=10),
    node=st.sampled_from(NODES),
)
def test_more_evidence_never_lengthens_the_window(
    events: list[Seen], more: list[Seen], node: str
) -> None:
    before, _, _ = play(events)
    after, _, _ = play([*events, *more])
    assert after.closes(node, CAP) <= before.closes(node, CAP)


@given(events=st.lists(seen, max_size=30), node=st.sampled_from(NODES), dt=st.floats(0.01, 2))
def test_a_reconnect_forgets_what_was_seen_before_it(
    events: list[Seen], node: str, dt: float
) -> None:
    w, now, _ = play(events)
    w.reconnected(now + dt, w.expected | {node})
    assert w.forgives(node, now + dt, CAP)
    assert w.closes(node, CAP) >= now + dt + w.floor_s


def test_no_reconnect_forgives_nothing() -> None:
    w = ReconnectWindow()
    w.heard_from("a", 1.0)
    assert not w.forgives("a", 1.0, CAP)
    assert not w.forgives("b", 0.0, CAP)


def test_a_node_dead_at_a_restart_is_blamed_well_before_the_cap() -> None:
    w = ReconnectWindow()
    w.reconnected(10.0, ["a", "b", "c"])
    w.heard_from("a", 10.1)
    assert w.forgives("c", 10.9, CAP)  # b is not back either: c may just be slow
    w.replied("b", 10.2)
    # The others took 0.2 s: c is given twice that, and the floor.
    assert w.closes("c", CAP) == 10.0 + max(w.floor_s, 2 * 0.2)
    assert not w.forgives("c", 10.6, CAP)
    assert not w.forgives("b", 10.3, CAP)  # answered: a no-responders now is a death
