"""How a router builds telemetry into its routes (:class:`SwarmView`): a snapshot that
moves a node up or down is built in at once; one that only refreshes figures is built in
at most every REBUILD_EVERY_S, so that many telemetry replicas writing ten times a
second each do not make a router rebuild its routes hundreds of times a second."""

from __future__ import annotations

import logging
import time

from hecate.core import FailoverOptions
from hecate.wire.messages import NodeTelemetry, TelemetrySnapshot
from hecate_router.swarmview import REBUILD_EVERY_S, REBUILD_SHARE, SwarmView
from tests.support.builders import pipeline, plan

PLAN = plan(
    [
        pipeline("m-a", "m", ("a0", 0, 4), ("a1", 4, 8)),
        pipeline("m-b", "m", ("b0", 0, 4), ("b1", 4, 8)),
    ]
)
WALL = 1_000.0


def snap(latency: dict[str, float], down: frozenset[str] = frozenset()) -> TelemetrySnapshot:
    return TelemetrySnapshot(
        written_at=WALL,
        nodes={
            n: NodeTelemetry(alive=n not in down, latency_ms=ms, last_seen=WALL)
            for n, ms in latency.items()
        },
    )


def view() -> SwarmView:
    v = SwarmView(
        failover=FailoverOptions(), suspect_s=1.0, stale_s=5.0, log=logging.getLogger("t")
    )
    v.adopt_plan(PLAN, 1, WALL)
    return v


def latency_of(v: SwarmView, node: str) -> float | None:
    assert v.router is not None
    return v.router.state.nodes[node].latency_ms


FAST = {"a0": 1.0, "a1": 1.0, "b0": 1.0, "b1": 1.0}


def test_figures_wait_for_the_next_rebuild_and_liveness_does_not() -> None:
    v = view()
    now = time.monotonic()  # the view times its rebuilds on this clock
    v.adopt_telemetry(snap(FAST), WALL, now)  # no part to tell: built in at once
    assert latency_of(v, "a0") == 1.0
    slower = snap({**FAST, "a0": 9.0})
    part = TelemetrySnapshot(written_at=WALL, nodes={"a0": slower.nodes["a0"]}, shard=0)
    v.adopt_telemetry(slower, WALL, now, part)  # right after a rebuild: held back
    assert latency_of(v, "a0") == 1.0
    v.catch_up(now)
    assert latency_of(v, "a0") == 1.0  # not due yet
    v.catch_up(time.monotonic() + REBUILD_EVERY_S)
    assert latency_of(v, "a0") == 9.0
    # A node going down is built in at once, however recent the last rebuild.
    dead = snap(FAST, down=frozenset({"a1"}))
    part = TelemetrySnapshot(written_at=WALL, nodes={"a1": dead.nodes["a1"]}, shard=1)
    v.adopt_telemetry(dead, WALL, time.monotonic(), part)
    assert v.router is not None
    assert not v.router.state.nodes["a1"].alive
    assert v.router.route("m", now=WALL).pipeline_id == "m-b"


def test_a_new_node_in_a_part_is_built_in_at_once() -> None:
    v = view()
    v.adopt_telemetry(snap({"a0": 1.0, "a1": 1.0}), WALL, time.monotonic())
    both = snap(FAST)
    part = TelemetrySnapshot(written_at=WALL, nodes={"b0": both.nodes["b0"]})
    v.adopt_telemetry(both, WALL, time.monotonic(), part)
    assert latency_of(v, "b0") == 1.0


def test_a_rebuild_that_takes_long_comes_less_often() -> None:
    """Routine rebuilds take at most REBUILD_SHARE of a router's time: one that took
    a second (a very large swarm) is followed by the next figures ten seconds later,
    while a node going down is still built in at once."""
    v = view()
    now = time.monotonic()
    v.adopt_telemetry(snap(FAST), WALL, now)
    v._rebuild_s = 1.0  # as a swarm of some 500,000 nodes would take
    assert v.rebuild_every() == 1.0 / REBUILD_SHARE
    slower = snap({**FAST, "a0": 9.0})
    part = TelemetrySnapshot(written_at=WALL, nodes={"a0": slower.nodes["a0"]})
    v.adopt_telemetry(slower, WALL, time.monotonic() + 1.0, part)
    v.catch_up(time.monotonic() + 1.0)
    assert latency_of(v, "a0") == 1.0
    v.catch_up(time.monotonic() + 1.0 / REBUILD_SHARE)
    assert latency_of(v, "a0") == 9.0
    v._rebuild_s = 1.0
    dead = snap({**FAST, "a0": 9.0}, down=frozenset({"a1"}))
    part = TelemetrySnapshot(written_at=WALL, nodes={"a1": dead.nodes["a1"]})
    v.adopt_telemetry(dead, WALL, time.monotonic(), part)
    assert v.router is not None
    assert not v.router.state.nodes["a1"].alive
