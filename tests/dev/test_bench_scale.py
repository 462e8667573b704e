"""The scale suite's measuring of one size, on real processes: a node host's
identities all called alive by telemetry and planned, and the figures it reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from hecate_dev.bench.cutoff import cut_off
from hecate_dev.bench.scale import one_size
from hecate_dev.hosts import unavailable


def test_one_size_forms_and_reports_what_each_node_costs(tmp_path: Path) -> None:
    level = one_size(20, heartbeat_ms=500, steady_s=0.5, form_timeout_s=30.0, tmp=tmp_path)
    assert level["formed"]
    assert level["alive"] == 20
    assert level["hosts"] == 1
    assert level["planned_nodes"] == 20
    assert level["pipelines"] == 3  # 160 layers of capacity, a 48-layer base: auto
    assert level["host_rss_mb"][0] > 0
    assert level["host_failures"] == []
    assert level["snapshot_bytes_per_node"] > 50  # every node's entry, whole
    assert level["snapshot_bytes"] >= 20 * level["snapshot_bytes_per_node"] - 200
    assert level["telemetry_cpu_per_s"] >= 0
    # Every node's share at least once; a node is written again only when a plan
    # changes what it holds.
    assert level["shares_written"] >= 20
    assert level["plans_published"] >= 1
    assert level["plan_bytes"] > 20 * 100
    assert level["beat_s"] == 0.5  # 20 nodes: far below the beat budget
    assert 0 < level["route_idle_us"]["p50"] <= level["route_idle_us"]["p99"]
    assert level["snapshot_ms"] > 0


def test_a_size_with_two_telemetry_replicas_hears_every_node_once(tmp_path: Path) -> None:
    level = one_size(
        20, heartbeat_ms=500, steady_s=1.0, form_timeout_s=30.0, tmp=tmp_path, shards=2
    )
    assert level["formed"]
    assert level["alive"] == 20
    assert level["telemetry_shards"] == 2
    assert len(level["shard_cpu_per_s"]) == 2
    # 20 nodes beating every 0.5 s: 40 beats a second in all, split by partition.
    assert level["beats_expected_per_s"] == 40
    heard = level["beats_heard_per_s"]
    assert all(h > 0 for h in heard), heard
    assert 20 <= sum(heard) <= 60, heard


@pytest.mark.skipif(unavailable() is not None, reason=f"no namespaces: {unavailable()}")
def test_the_cut_off_measures_a_rack_lost_under_load() -> None:
    retire = ("--retire-after-ms", "1000")
    c = cut_off(2, rack=6, at_once=2, heartbeat_ms=100, after_s=1.0, planner_args=retire)
    assert c["formed"], c
    assert c["called_down"] == 6
    assert 0 < c["down_p50_s"] <= c["down_p99_s"] <= c["down_last_s"]
    assert c["failed"] == 0, c["errors"]
    assert c["wrong"] == 0
    assert c["answered"] > 0
    assert c["repaired_s"] is not None
    assert c["plans_until_repaired"] >= 1
    assert c["back_s"] is not None
