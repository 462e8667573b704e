"""What ``hecate up`` starts (:func:`hecate_launcher.plan_commands`): pure."""

from __future__ import annotations

from pathlib import Path

from hecate.cli.main import build_parser
from hecate_launcher import plan_commands

TOPOLOGY = Path(__file__).resolve().parents[3] / "examples" / "swarm.json"


def telemetry(*flags: str) -> dict[str, tuple[str, ...]]:
    args = build_parser().parse_args(["up", "--topology", str(TOPOLOGY), *flags])
    return {
        spec.label: spec.argv
        for spec in plan_commands(args, "nats://x")
        if spec.argv[0] == "telemetry"
    }


def test_one_telemetry_replica_by_default() -> None:
    assert list(telemetry()) == ["telemetry"]


def test_a_standby_for_each_shard_reads_the_same_partitions_under_its_own_id() -> None:
    started = telemetry("--telemetry-shards", "2", "--telemetry-standby")
    assert list(started) == [
        "telemetry-0",
        "telemetry-0-standby",
        "telemetry-1",
        "telemetry-1-standby",
    ]
    for label, argv in started.items():
        shard = label.split("-")[1]
        assert argv[argv.index("--id") + 1] == label
        assert argv[argv.index("--shard") + 1] == shard
        assert argv[argv.index("--shards") + 1] == "2"
    alone = telemetry("--telemetry-standby")
    assert list(alone) == ["telemetry", "telemetry-standby"]
    assert "--shard" not in alone["telemetry-standby"]


def test_the_nodes_beat_budget_grows_with_the_telemetry_replicas() -> None:
    args = build_parser().parse_args(["up", "--topology", str(TOPOLOGY), "--telemetry-shards", "3"])
    nodes = [s.argv for s in plan_commands(args, "nats://x") if s.argv[0] == "node"]
    assert nodes
    for argv in nodes:
        assert argv[argv.index("--heartbeat-budget-per-s") + 1] == "6000"
    alone = build_parser().parse_args(["up", "--topology", str(TOPOLOGY)])
    assert all("--heartbeat-budget-per-s" not in s.argv for s in plan_commands(alone, "nats://x"))
