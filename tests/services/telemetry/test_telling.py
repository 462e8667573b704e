"""Deltas and snapshots (:mod:`hecate_telemetry.telling`) and a follower applying them
(:class:`hecate.bus.telemetry.Shards`): pure, no bus."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hecate.bus.telemetry import Shards
from hecate.wire.messages import NodeTelemetry, TelemetryDelta, TelemetrySnapshot
from hecate_telemetry.telling import Teller, Tolerance, Writes, moved

TOL = Tolerance()


def node(alive: bool = True, latency: float | None = 10.0, **more: object) -> NodeTelemetry:
    return msgspec.structs.replace(NodeTelemetry(alive=alive, latency_ms=latency), **more)


def delta(writes: Writes) -> TelemetryDelta:
    assert writes.delta is not None
    return msgspec.json.decode(writes.delta, type=TelemetryDelta)


def keyframe(writes: Writes) -> TelemetrySnapshot:
    assert writes.keyframe is not None
    return msgspec.json.decode(writes.keyframe, type=TelemetrySnapshot)


class Swarm:
    """Telemetry's side: the truth, and the teller in front of it."""

    def __init__(self, **teller: object) -> None:
        self.truth: dict[str, NodeTelemetry] = {}
        self.teller = Teller(shard=0, shards=1, epoch=1.0, **teller)  # type: ignore[arg-type]
        self.now = 0.0
        self.kv: TelemetrySnapshot | None = None

    def set(self, node_id: str, t: NodeTelemetry) -> None:
        self.truth[node_id] = t
        self.teller.touch(node_id)

    def tick(self, dt: float = 0.1) -> Writes:
        self.now += dt
        writes = self.teller.write(self.now, self.now, self.truth.__getitem__, self.truth)
        if writes.keyframe is not None:
            self.kv = keyframe(writes)
            self.teller.kept(writes, self.now)
        return writes


def test_a_figure_is_told_again_only_past_the_tolerance() -> None:
    assert not moved(node(latency=10.0), node(latency=10.9), TOL)  # under the 1 ms floor
    assert moved(node(latency=10.0), node(latency=11.1), TOL)
    assert not moved(node(latency=100.0), node(latency=109.0), TOL)  # under 10 %
    assert moved(node(latency=100.0), node(latency=111.0), TOL)
    assert moved(node(latency=None), node(latency=1.0), TOL)
    assert moved(node(), node(in_flight=1), TOL)
    assert moved(node(), node(alive=False), TOL)
    assert moved(node(), node(draining=True), TOL)


def test_a_node_heard_with_steady_figures_is_named_not_sent() -> None:
    swarm = Swarm()
    swarm.set("a", node(last_seen=1.0))
    first = delta(swarm.tick())
    assert set(first.nodes) == {"a"}  # new: told whole
    swarm.tick(2.0)  # a snapshot: the flip is told, no longer repeated
    swarm.set("a", node(latency=10.5, last_seen=2.0))
    later = delta(swarm.tick())
    assert later.nodes == {}
    assert later.heard == {"a": 2.0}
    assert later.base == later.seq - 1


def test_every_flip_since_the_snapshot_is_in_every_delta() -> None:
    swarm = Swarm(keyframe_min_s=100.0)
    swarm.set("a", node())
    swarm.set("b", node())
    swarm.tick()  # the first snapshot, at once
    swarm.set("a", node(alive=False))
    assert set(delta(swarm.tick()).nodes) == {"a"}
    swarm.set("b", node(last_seen=5.0))
    again = delta(swarm.tick())
    assert not again.nodes["a"].alive  # repeated: a follower that missed it has it now
    assert again.heard == {"b": 5.0}


def test_snapshots_keep_to_their_byte_budget_unless_many_nodes_flip() -> None:
    swarm = Swarm(keyframe_min_s=1.0, keyframe_bytes_s=1000.0, flips_cap=3)
    for i in range(20):
        swarm.set(f"n{i}", node())
    assert swarm.tick().keyframe is not None  # the first, at once (20 flips, too)
    size = swarm.teller.keyframe_size
    assert size > 1000  # so the next is due size / 1000 seconds later, not 1 s
    swarm.set("n0", node(load=0.9))
    assert swarm.tick(1.5).keyframe is None
    assert swarm.tick(size / 1000).keyframe is not None
    for i in range(4):  # a rack lost: more flips than the cap
        swarm.set(f"n{i}", node(alive=False))
    forced = swarm.tick(0.1)
    assert forced.keyframe is not None
    assert keyframe(forced).seq == delta(forced).seq  # the state after that delta


def test_a_snapshot_that_could_not_be_put_is_not_named() -> None:
    teller = Teller(shard=0, shards=1, epoch=1.0)
    teller.touch("a")
    truth = {"a": node()}
    first = teller.write(1.0, 1.0, truth.__getitem__, truth)
    assert first.keyframe is not None  # not kept: the server was away
    teller.touch("a")
    second = teller.write(1.1, 1.1, truth.__getitem__, truth)
    assert delta(second).keyframe == 0
    assert second.keyframe is not None  # tried again


def test_a_follower_starting_late_reads_the_snapshot_then_applies_what_follows() -> None:
    swarm = Swarm()
    swarm.set("a", node())
    swarm.tick()
    swarm.set("b", node())
    swarm.tick(5.0)  # a snapshot holding a and b
    follower = Shards()
    assert swarm.kv is not None
    follower.adopt(swarm.kv)
    swarm.set("a", node(alive=False))
    step = follower.apply(delta(swarm.tick()))
    assert step is not None
    merged, part = step
    assert set(part.nodes) == {"a"}
    assert not merged.nodes["a"].alive
    assert merged.nodes["b"].alive
    assert follower.stats.gaps == 0


EVENTS = st.lists(
    st.tuples(
        st.sampled_from("abcdef"),  # node
        st.booleans(),  # alive
        st.floats(1, 500, allow_nan=False),  # latency
        st.integers(0, 3),  # in flight
        st.booleans(),  # this tick's delta reaches the follower
        st.floats(0.05, 3.0),  # time to the next tick
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(EVENTS, st.integers(0, 4))
# A snapshot written with a's latency at 123 while its followers were last told 120: an
# adopter held 123, and 108 (within the tolerance of 120) was never sent.
@example(
    [("a", False, 1.0, 0, False, 1.0)] * 12
    + [("a", False, 1.0, 0, False, 1.844736468490824)]
    + [("a", False, 120.0, 0, False, 1.0), ("a", False, 123.0, 0, False, 2.0)]
    + [("a", False, 108.0, 0, True, 1.0)],
    0,
)
def test_a_follower_missing_deltas_has_every_nodes_liveness_at_the_next_one(
    events: list[tuple[str, bool, float, int, bool, float]], flips_cap: int
) -> None:
    """Whatever changes and whichever deltas are lost: after each delta it receives, a
    follower holds every node the replica knows, with its liveness as the replica has
    it; and once it is in step (nothing missed since its latest snapshot) every figure
    is within the tolerance of the truth."""
    swarm = Swarm(keyframe_bytes_s=200.0, flips_cap=flips_cap)
    follower = Shards()
    for name, alive, latency, in_flight, delivered, dt in events:
        swarm.set(
            name, node(alive=alive, latency=latency, in_flight=in_flight, last_seen=swarm.now)
        )
        writes = swarm.tick(dt)
        if writes.delta is None or not delivered:
            continue
        d = delta(writes)
        if follower.wants_snapshot(d):
            assert swarm.kv is not None
            follower.adopt(swarm.kv)
        step = follower.apply(d)
        if step is None:
            continue
        merged, _part = step
        assert set(merged.nodes) == set(swarm.truth)
        for node_id, truth in swarm.truth.items():
            held = merged.nodes[node_id]
            assert held.alive == truth.alive, node_id
        if follower.held[0].missed is None:
            for node_id, truth in swarm.truth.items():
                held = merged.nodes[node_id]
                assert held.in_flight == truth.in_flight
                assert held.latency_ms is not None
                assert truth.latency_ms is not None
                assert abs(held.latency_ms - truth.latency_ms) <= max(
                    TOL.latency_ms, TOL.relative * held.latency_ms
                )


def test_a_swarm_gone_quiet_is_owed_a_snapshot_of_its_last_changes() -> None:
    swarm = Swarm(keyframe_min_s=1.0)
    swarm.set("a", node())
    swarm.tick()  # the first snapshot, at once
    assert swarm.teller.owed(swarm.now) is None  # nothing since
    swarm.set("a", node(alive=False))
    swarm.tick(0.1)  # a delta, the snapshot not due yet
    owed = swarm.teller.owed(swarm.now)
    assert owed is not None
    assert owed == pytest.approx(0.9)
    writes = swarm.tick(owed)  # the writer wakes with nothing new (the flip told again)
    assert writes.keyframe is not None
    assert swarm.kv is not None
    assert not swarm.kv.nodes["a"].alive
    assert swarm.teller.owed(swarm.now) is None
