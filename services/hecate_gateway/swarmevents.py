"""The swarm's events (``hecate.events.*``) as lines of the operator's feed and counts in
its tallies: one function per event subject, each decoding its body and adding its line.
Raises ``msgspec.DecodeError`` for a body that does not decode."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from hecate.wire import subjects
from hecate.wire.messages import (
    BreakerChanged,
    FailoverEvent,
    NodeEvent,
    PlanChanged,
    ServiceRestarted,
)
from hecate_gateway.swarmfeed import Feed, Tally

_failover = msgspec.json.Decoder(FailoverEvent)
_plan_changed = msgspec.json.Decoder(PlanChanged)
_node_event = msgspec.json.Decoder(NodeEvent)
_breaker_changed = msgspec.json.Decoder(BreakerChanged)
_restarted = msgspec.json.Decoder(ServiceRestarted)

EVENT_SUBJECTS = (
    subjects.EVENT_FAILOVER,
    subjects.EVENT_PLAN,
    subjects.EVENT_NODE_DOWN,
    subjects.EVENT_NODE_UP,
    subjects.EVENT_BREAKER,
    subjects.EVENT_RESTARTED,
)


def failover(feed: Feed, tally: Tally, data: bytes) -> None:
    e = _failover.decode(data)
    tally.failover(e.kind)
    to = e.new_route.pipeline_id if e.new_route else "nothing"
    feed.add(
        "failover",
        e.kind,
        f"{e.model_id} lost {e.lost_node}: {e.old_route.pipeline_id} -> {to} ({e.reason})",
        e.at,
        node_id=e.lost_node,
        model_id=e.model_id,
    )


def plan_changed(feed: Feed, tally: Tally, data: bytes) -> None:
    e = _plan_changed.decode(data)
    heard = tally.plan_heard
    tally.plan_heard = e.at if heard is None else max(heard, e.at)
    if e.previous == e.epoch and e.changed == ():
        # The planner saying its notice again (every few seconds, for nodes that missed
        # it): news to nobody reading the feed, where it would push real events out of
        # view within a minute. It only marks the planner as heard.
        return
    feed.add(
        "plan",
        e.strategy,
        f"plan epoch {e.epoch}: {e.pipelines} pipelines ({e.reason})",
        e.at,
    )


def node(feed: Feed, _tally: Tally, data: bytes) -> None:
    e = _node_event.decode(data)
    feed.add("node", e.state, f"{e.node_id} {e.state} ({e.reason})", e.at, node_id=e.node_id)


def breaker(feed: Feed, tally: Tally, data: bytes) -> None:
    e = _breaker_changed.decode(data)
    trip = tally.breaker(e.target, e.state)
    left = f" for {max(e.open_until - e.at, 0):.0f} s" if e.state == "open" else ""
    what = "tripped open" if trip else e.state.replace("_", "-")
    feed.add(
        "breaker",
        e.state,
        f"circuit of {e.target} {what}{left} ({e.reason})",
        e.at,
        node_id=e.target,
    )


def restarted(feed: Feed, _tally: Tally, data: bytes) -> None:
    e = _restarted.decode(data)
    feed.add(
        "service",
        "restarted",
        f"{e.label} exited ({e.exit_code}) and was started again after {e.delay_s:g} s "
        f"(restart {e.restarts})",
        e.at,
    )


EVENTS: dict[str, Callable[[Feed, Tally, bytes], None]] = {
    subjects.EVENT_FAILOVER: failover,
    subjects.EVENT_PLAN: plan_changed,
    subjects.EVENT_NODE_DOWN: node,
    subjects.EVENT_NODE_UP: node,
    subjects.EVENT_BREAKER: breaker,
    subjects.EVENT_RESTARTED: restarted,
}
