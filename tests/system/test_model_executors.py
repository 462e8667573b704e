"""A node can never answer for a real model with the toy network, on real processes.

The model declares what executes it: with only toy nodes in the swarm, a model declared
``smollm2`` is not planned, so its requests get the router's explicit error instead of
toy text under the real model's name; a plan that gives one to a toy node anyway is
refused by the node; ``hecate up`` refuses such a topology before starting anything.
No test here loads SmolLM2.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import msgspec
from nats.aio.client import Client

from hecate.bus import kv as kvs
from hecate.core import ModelSpec, NodeProfile, Pipeline, Stage, SwarmPlan
from hecate.wire import subjects
from hecate.wire.messages import ErrorReply, LayersStage
from hecate_planner.planstore import publish_by_hand
from tests.support.swarm import Processes, hecate_argv, infer, start_swarm, wait_until_serving
from tests.support.waits import until

REAL = "smollm2-135m"
_error_reply = msgspec.msgpack.Decoder(ErrorReply)


def write(path: Path, doc: dict[str, object]) -> Path:
    path.write_text(json.dumps(doc))
    return path


def mixed_topology(tmp_path: Path) -> Path:
    """A toy base and the real model beside it, each with a node of its own in the file
    (so the file is valid); the tests start only the toy nodes, roomy enough for both."""
    return write(
        tmp_path / "mixed.json",
        {
            "models": [
                {"id": "ncm-base", "layers": 4, "role": "base"},
                {"id": REAL, "layers": 30, "role": "expert", "executor": "smollm2"},
            ],
            "nodes": [
                {"id": "toy-a", "capacity_layers": 40},
                {"id": "real-a", "capacity_layers": 30, "executor": "smollm2"},
            ],
        },
    )


async def test_a_model_no_node_can_execute_is_not_planned_and_its_requests_say_so(
    processes: Processes, client: Client, tmp_path: Path
) -> None:
    start_swarm(processes, mixed_topology(tmp_path), [("toy-a", 40, 5.0, 1.0)], pipelines=1)
    await wait_until_serving(client, "ncm-base")

    kv = await kvs.bucket(client, subjects.PLAN_BUCKET)
    plan = msgspec.json.decode((await kv.get(subjects.PLAN_KEY)).value or b"", type=SwarmPlan)
    # toy-a had room for all 30 layers: before, it was given them and answered toy text.
    assert plan.pipelines_of(REAL) == ()
    assert [p.model_id for p in plan.pipelines] == ["ncm-base"]
    assert {n.node_id: n.executor for n in plan.nodes} == {"toy-a": "toy"}

    reply = await infer(client, REAL, "The capital of France is")
    assert not reply.ok
    assert reply.error is not None
    assert reply.error.code == "no_such_model"
    assert reply.output is None

    lines = [
        json.loads(line)
        for line in processes.log("planner").splitlines()
        if "no node runs its executor" in line
    ]
    assert len(lines) == 1, lines
    assert lines[0]["model_id"] == REAL
    assert lines[0]["executor"] == "smollm2"
    assert lines[0]["executors_present"] == ["toy"]


async def test_a_toy_node_refuses_ranges_of_a_model_declared_for_another_executor(
    processes: Processes, client: Client
) -> None:
    # Written by hand, as no planner would: the real model's layers on a toy node.
    plan = SwarmPlan(
        epoch=0,
        models=(ModelSpec(model_id=REAL, layers=4, executor="smollm2"),),
        nodes=(NodeProfile(node_id="toy-a", capacity_layers=4),),
        pipelines=(
            Pipeline(
                pipeline_id=f"{REAL}-r0",
                model_id=REAL,
                stages=(Stage(node_id="toy-a", layer_start=0, layer_end=4),),
            ),
        ),
    )
    revision = await publish_by_hand(client, plan)
    processes.node("toy-a", 4)
    await until(
        lambda: "ranges refused" in processes.log("node-toy-a"), "the node refuses the ranges"
    )
    refused = next(
        json.loads(line)
        for line in processes.log("node-toy-a").splitlines()
        if "ranges refused" in line
    )
    assert refused["model_id"] == REAL
    assert refused["executor"] == "smollm2"
    assert refused["node_executor"] == "toy"

    request = LayersStage(
        request_id=f"direct-{time.monotonic_ns()}",
        model_id=REAL,
        layer_start=0,
        layer_end=4,
        model_layers=4,
        epoch=revision,
        prompt="The capital of France is",
        decode_tokens=4,
    )
    msg = await client.request(
        subjects.node_run("toy-a"), msgspec.msgpack.encode(request), timeout=5
    )
    reply = _error_reply.decode(msg.data)
    assert not reply.ok
    assert reply.error.code == "not_hosted"


def test_hecate_up_refuses_a_model_none_of_its_nodes_runs_before_starting_anything(
    tmp_path: Path,
) -> None:
    # The executor runs only on a growth node, which hecate up does not start.
    topology = write(
        tmp_path / "late.json",
        {
            "models": [
                {"id": "ncm-base", "layers": 4, "role": "base"},
                {"id": REAL, "layers": 30, "role": "expert", "executor": "smollm2"},
            ],
            "nodes": [{"id": "toy-a", "capacity_layers": 40}],
            "growth": [{"id": "real-a", "capacity_layers": 30, "executor": "smollm2"}],
        },
    )
    state = tmp_path / "state"
    done = subprocess.run(
        [*hecate_argv(), "up", "--topology", str(topology), "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"model '{REAL}' needs executor 'smollm2'" in done.stderr
    assert "toy-a (toy)" in done.stderr
    assert not state.exists()  # no server, no process, not even its state directory
