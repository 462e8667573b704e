"""The merge of telemetry replicas' snapshots (:class:`hecate.bus.telemetry.Shards`):
pure, no bus. Deltas between them: tests/services/telemetry/test_telling.py."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hecate.bus.telemetry import Shards
from hecate.wire.messages import NodeTelemetry, TelemetrySnapshot


def snap(
    shard: int, shards: int, nodes: dict[str, bool], at: float, seq: int = 1
) -> TelemetrySnapshot:
    return TelemetrySnapshot(
        written_at=at,
        nodes={n: NodeTelemetry(alive=a, last_seen=at) for n, a in nodes.items()},
        seq=seq,
        shard=shard,
        shards=shards,
    )


def test_the_merge_holds_every_shards_nodes_and_is_as_old_as_its_stalest_shard() -> None:
    shards = Shards()
    assert shards.merged() is None
    one = shards.adopt(snap(0, 2, {"a": True, "b": True}, 10.0))
    assert one is not None
    assert set(one.nodes) == {"a", "b"}
    both = shards.adopt(snap(1, 2, {"c": False}, 12.0))
    assert both is not None
    assert set(both.nodes) == {"a", "b", "c"}
    assert not both.nodes["c"].alive
    assert both.written_at == 10.0
    assert both.shards == 2
    assert both.seq == 2


def test_an_older_snapshot_of_a_shard_held_whole_is_left_out() -> None:
    shards = Shards()
    shards.adopt(snap(0, 1, {"a": False}, 2.0, seq=5))
    assert shards.adopt(snap(0, 1, {"a": True}, 1.0, seq=4)) is None
    assert shards.stats.stale == 1
    merged = shards.merged()
    assert merged is not None
    assert not merged.nodes["a"].alive


def test_a_restarted_replica_replaces_what_its_predecessor_said() -> None:
    """A new epoch counts from 1 again: its snapshot is taken however low its seq."""
    shards = Shards()
    shards.adopt(snap(0, 1, {"a": True, "b": True}, 2.0, seq=500))
    fresh = TelemetrySnapshot(
        written_at=3.0, nodes={"a": NodeTelemetry(alive=True)}, seq=1, epoch=3.0
    )
    merged = shards.adopt(fresh)
    assert merged is not None
    assert set(merged.nodes) == {"a"}


def test_a_new_layout_drops_the_keys_of_the_old_one() -> None:
    """Four replicas scaled to two: the old four's keys linger in the bucket, and the
    first snapshot of the new layout puts them out of the merge."""
    shards = Shards()
    for k in range(4):
        shards.adopt(snap(k, 4, {f"old{k}": True}, 5.0))
    merged = shards.adopt(snap(0, 2, {"x": True}, 6.0))
    assert merged is not None
    assert set(merged.nodes) == {"x"}
    assert merged.shards == 2


def test_a_node_in_two_shards_is_taken_from_the_freshest() -> None:
    shards = Shards()
    shards.adopt(snap(0, 2, {"a": True}, 3.0))
    merged = shards.adopt(snap(1, 2, {"a": False}, 4.0))
    assert merged is not None
    assert not merged.nodes["a"].alive
    merged = shards.adopt(snap(0, 2, {"a": True}, 5.0))
    assert merged is not None
    assert merged.nodes["a"].alive


@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # shard
            st.dictionaries(st.sampled_from("abcdefgh"), st.booleans(), max_size=4),
            st.floats(0, 100),  # written_at
        ),
        max_size=20,
    )
)
def test_the_merge_is_what_each_shard_last_said(
    updates: list[tuple[int, dict[str, bool], float]],
) -> None:
    """Whatever order snapshots of one layout arrive in, the merge holds exactly the
    nodes of each shard's latest snapshot, each as the freshest of those says."""
    shards = Shards()
    latest: dict[int, TelemetrySnapshot] = {}
    for shard, nodes, at in updates:
        s = snap(shard, 4, nodes, at)
        latest[shard] = s
        merged = shards.adopt(s)
        assert merged is not None, "a snapshot of a shard held at the same seq is taken"
        assert set(merged.nodes) == set().union(*(x.nodes for x in latest.values()))
        assert merged.written_at == min(x.written_at for x in latest.values())
        for node, t in merged.nodes.items():
            said = [x for x in latest.values() if node in x.nodes]
            assert t.alive in {x.nodes[node].alive for x in said}
            newest = max(x.written_at for x in said)
            assert t.alive in {x.nodes[node].alive for x in said if x.written_at == newest}
