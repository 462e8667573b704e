"""A model no node can hold is pooled over nodes that each hold their share, under real
memory limits: each node process in a cgroup v1 memory group of 1.5 GiB, the 1B shape
(Llama-3.2-1B's blocks, hidden and heads; random Q4_K weights written at test time).

A node told to hold the whole model (``--capacity-layers 16``) in that limit refuses
before loading, naming the bytes, and joins again with what fits; the planner plans
around it once two more such nodes join, and the three answer token for token what one
unconstrained process answers. No node is killed for memory (the groups' own counters
say so). Skipped, with the reason, where cgroup v1's memory controller cannot be used.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from gguf import GGMLQuantizationType as Q
from nats.aio.client import Client

from hecate.bus import kv as kvs
from hecate.core import SwarmPlan
from hecate.llm import store
from hecate.llm.reference import greedy_text
from hecate.llm.store import pull
from hecate.wire import subjects
from hecate_dev import cgroups
from hecate_dev.synthetic_gguf import Shape, write
from hecate_launcher.supervisor import ProcessSpec, hecate_command
from tests.support.swarm import Processes, infer, start_planner, start_router
from tests.support.waits import until

pytestmark = pytest.mark.usefixtures("prepared_model")

MODEL = "pooled-1b"
SHAPE = Shape(
    layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192, context=8192,
    rope_base=500000.0, tied=True,
)  # fmt: skip
LIMIT = 1536 << 20
PROMPT = "The capital of France is"
TOKENS = 8


@pytest.fixture
def groups() -> Iterator[dict[str, cgroups.MemoryCgroup]]:
    usable = cgroups.available()
    if not usable:
        pytest.skip(f"no cgroup v1 memory controller to limit nodes with: {usable.reason}")
    made = {n: cgroups.MemoryCgroup(f"pooled-{n}-{os.getpid()}", LIMIT).create() for n in "abc"}
    try:
        yield made
    finally:
        for group in made.values():
            group.close()


def node(processes: Processes, group: cgroups.MemoryCgroup, node_id: str, *flags: str) -> None:
    """``hecate node`` inside ``group`` from its first instruction."""
    argv = ("node", "--id", node_id, "--executor", MODEL, *flags, "--nats", processes.url)
    env = {"OPENBLAS_NUM_THREADS": "1", "HECATE_LOG_LEVEL": "INFO", "HECATE_ENGINE_THREADS": "1"}
    program = tuple(group.command(hecate_command()))
    processes.supervisor.start(ProcessSpec(f"node-{node_id}", argv, env, program=program))


def logged(processes: Processes, label: str, message: str) -> list[dict[str, object]]:
    lines = processes.log(label).splitlines()
    return [json.loads(line) for line in lines if f'"{message}"' in line]


async def plan_of(client: Client) -> SwarmPlan | None:
    kv = await kvs.bucket(client, subjects.PLAN_BUCKET)
    try:
        entry = await kv.get(subjects.PLAN_KEY)
    except Exception:
        return None
    return msgspec.json.decode(entry.value or b"", type=SwarmPlan)


async def test_a_model_no_node_can_hold_is_served_by_three_each_holding_its_share(
    processes: Processes,
    client: Client,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    groups: dict[str, cgroups.MemoryCgroup],
) -> None:
    tokenizer = pull("smollm2-135m", progress=lambda _line: None)
    path = tmp_path / f"{MODEL}.gguf"
    write(path, Q.Q4_K, SHAPE, 0, tokenizer=tokenizer)
    monkeypatch.setenv("HECATE_MODELS", str(tmp_path / "models"))
    store.add(MODEL, path, progress=lambda _line: None)
    topology = tmp_path / "pooled.json"
    nodes = [{"id": n, "capacity_layers": SHAPE.layers, "executor": MODEL} for n in "abc"]
    model = {"id": MODEL, "layers": SHAPE.layers, "executor": MODEL}
    topology.write_text(json.dumps({"models": [model], "nodes": nodes}))
    processes.start("telemetry", "telemetry", "--id", "telemetry")
    start_router(processes, "router-1", topology, stage_timeout_ms=20_000)
    # a node's changed profile planned as soon as it is heard (not at most every 30 s)
    start_planner(processes, topology, 1, extra=("--profile-pace-ms", "200"))

    # Alone, told to hold all 16 layers: it refuses before loading, naming the bytes.
    node(processes, groups["a"], "a", "--capacity-layers", str(SHAPE.layers))
    await until(
        lambda: bool(logged(processes, "node-a", "capacity lowered")),
        "node a refusing what does not fit and joining again",
        timeout=90,
    )
    refused = logged(processes, "node-a", "ranges refused: they do not fit this node's memory")
    assert refused, processes.log("node-a")
    said = str(refused[0]["refused"])
    assert said.startswith("layers 0-16 need "), said
    assert "this node has" in said, said
    assert "(cgroup)" in said, said
    weighed = logged(processes, "node-a", "memory weighed")[0]
    assert weighed["memory"] == LIMIT, weighed
    assert weighed["memory_from"] == "cgroup", weighed
    fit = int(str(weighed["fit"]))
    assert 0 < fit < SHAPE.layers, weighed  # no node holds the model
    assert 3 * fit >= SHAPE.layers, weighed  # three do

    # Two more in the same limits, their capacity what fits: the three hold it.
    node(processes, groups["b"], "b")
    node(processes, groups["c"], "c")

    async def pooled() -> bool:
        plan = await plan_of(client)
        return plan is not None and any(len(p.stages) == 3 for p in plan.pipelines_of(MODEL))

    await until(pooled, "a plan of the model over three nodes", timeout=90)
    plan = await plan_of(client)
    assert plan is not None
    for n in plan.nodes:
        assert n.memory_bytes == LIMIT, n
        assert n.memory_from == "cgroup", n
        assert n.capacity_layers == fit, n
    reply = None
    for _ in range(60):  # loading: the first answers may be a retry's
        reply = await infer(client, MODEL, PROMPT, TOKENS, timeout=60.0)
        if reply.ok:
            break
    assert reply is not None
    assert reply.ok, reply
    assert reply.output == greedy_text(path, PROMPT, TOKENS, "onnx")

    for name, group in groups.items():
        use = group.use()
        assert not use.oom_killed, f"node {name} met the OOM killer: {use}"
        assert processes.procs[f"node-{name}"].poll() is None, processes.log(f"node-{name}")
