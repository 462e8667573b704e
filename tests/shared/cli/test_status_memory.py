"""``hecate status`` shows each node's memory in use against its limit and where the
limit comes from, from the plan's profiles and telemetry's snapshot (pure: no bus)."""

from __future__ import annotations

import time

import msgspec

from hecate.cli.client import render
from hecate.core import NodeProfile
from hecate.wire.messages import NodeTelemetry, TelemetrySnapshot
from tests.support.builders import pipeline, plan

MIB = 2**20


def test_each_node_s_memory_in_use_is_shown_against_its_limit() -> None:
    base = plan([pipeline("m-r0", "m", ("a", 0, 8), ("b", 8, 16), ("c", 16, 24))])
    profiles = {
        "a": NodeProfile(node_id="a", capacity_layers=8, memory_bytes=1536 * MIB),
        "b": NodeProfile(node_id="b", capacity_layers=8, memory_bytes=4096 * MIB),
        "c": NodeProfile(node_id="c", capacity_layers=8),  # an executor that holds no weights
    }
    profiles["a"] = msgspec.structs.replace(profiles["a"], memory_from="cgroup")
    profiles["b"] = msgspec.structs.replace(profiles["b"], memory_from="flag")
    swarm = msgspec.structs.replace(base, nodes=tuple(profiles[n.node_id] for n in base.nodes))
    now = time.time()
    used = {"a": 852 * MIB, "b": 0, "c": 60 * MIB}
    snapshot = TelemetrySnapshot(
        written_at=now,
        nodes={n: NodeTelemetry(alive=True, last_seen=now, memory_used=u) for n, u in used.items()},
    )
    info = {
        "plan": msgspec.json.encode(swarm),
        "epoch": 3,
        "telemetry": msgspec.json.encode(snapshot),
        "routers": [],
        "breakers": {},
    }
    lines = {line.split()[0]: line for line in render(info).splitlines() if line}
    assert "memory MiB" in lines["node"]
    assert "852/1,536 cgroup" in lines["a"]
    assert "-/4,096 flag" in lines["b"]  # not heard yet
    assert lines["c"].split()[-2] == "60"
