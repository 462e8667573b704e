"""SmolLM2 across real node processes: greedy text equals the single-process model's,
with and without a node SIGKILLed in the middle of the generation."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from hecate.bus.settle import settled
from hecate.bus.streamed import request_streamed
from hecate.client import HecateClient
from hecate.llm.reference import greedy_text
from hecate.llm.store import pull
from hecate.llm.tokenizer import chat_prompt, load_tokenizer
from hecate.wire import subjects
from hecate.wire.messages import (
    ChatMessage,
    FailoverEvent,
    InferReply,
    InferRequest,
    StreamToken,
)
from tests.support.swarm import Processes, start_planner
from tests.support.waits import endpoint_data, stats, until

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

MODEL = "smollm2-135m"


def reference(prompt: str, max_tokens: int, engine: str = "onnx") -> str:
    """The text in one process on the nodes' engine, prompt and steps run as they do."""
    return greedy_text(pull(MODEL, progress=lambda _line: None), prompt, max_tokens, engine)


def start(
    processes: Processes,
    tmp_path: Path,
    nodes: list[str],
    pipelines: int,
    dispatch: str = "hop",
    router_args: tuple[str, ...] = (),
    executor: str = "smollm2",
) -> None:
    pull(MODEL, progress=lambda _line: None)
    topology = tmp_path / "llm.json"
    topology.write_text(
        json.dumps(
            {
                "models": [{"id": MODEL, "layers": 30, "role": "base", "executor": executor}],
                "nodes": [{"id": n, "capacity_layers": 10, "executor": executor} for n in nodes],
            }
        )
    )
    processes.start("telemetry", "telemetry", "--id", "telemetry")
    start_planner(processes, topology, pipelines)
    processes.start(
        "router-1",
        "router",
        "--id",
        "router-1",
        "--stage-timeout-ms",
        "5000",
        "--dispatch",
        dispatch,
        *router_args,
    )
    for n in nodes:
        processes.start(
            f"node-{n}", "node", "--id", n, "--capacity-layers", "10", "--executor", executor
        )


async def generate(
    client: Client, prompt: str, max_tokens: int, stream: list[StreamToken] | None = None
) -> InferReply:
    async def on_token(msg: Msg) -> None:
        if stream is not None:
            stream.append(msgspec.json.decode(msg.data, type=StreamToken))

    body = InferRequest(prompt=prompt, max_tokens=max_tokens)
    msg = await request_streamed(
        client, subjects.stream(MODEL), msgspec.json.encode(body), timeout=60, on_token=on_token
    )
    return msgspec.json.decode(msg.data, type=InferReply)


async def ask(client: Client, request: InferRequest) -> InferReply:
    msg = await client.request(subjects.infer(MODEL), msgspec.json.encode(request), timeout=60)
    return msgspec.json.decode(msg.data, type=InferReply)


async def middle_stages(client: Client) -> list[str]:
    """The nodes that receive a middle stage (layers 10-20 of 30) from now on, in order.
    Every stage request, routed or chained, travels on its node's run subject, which a
    plain subscriber hears too: so a test kills the node a generation really runs on,
    not one an earlier request happened to take."""
    seen: list[str] = []

    async def on_stage(msg: Msg) -> None:
        stage = msgspec.msgpack.decode(msg.data)
        if stage["layer_start"] > 0 and stage["layer_end"] < 30:
            seen.append(msg.subject.split(".")[2])

    await client.subscribe(subjects.node_run("*"), cb=on_stage)
    await settled(client)
    return seen


async def ready(client: Client) -> None:
    for _ in range(300):
        try:
            reply = await generate(client, "Hi", 1)
            if reply.ok:
                return
        except Exception:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError("the model never served")


@pytest.mark.parametrize("dispatch", ["hop", "chain"])
async def test_three_stages_generate_the_single_process_text_and_stream_it(
    processes: Processes, client: Client, tmp_path: Path, dispatch: str
) -> None:
    start(processes, tmp_path, ["a", "b", "c"], pipelines=1, dispatch=dispatch)
    await ready(client)
    stream: list[StreamToken] = []
    reply = await generate(client, "The capital of France is", 8, stream)
    assert reply.ok, reply.error
    assert reply.output is not None
    assert reply.output.startswith(" Paris")
    assert reply.output == reference("The capital of France is", 8)
    assert [t.index for t in stream] == list(range(len(stream)))
    assert "".join(t.text for t in stream) == reply.output
    assert reply.route is not None
    assert [s.node_id for s in reply.route.stages] == ["a", "b", "c"]
    # The client SDK (and so `hecate infer`) streams the same tokens.
    seen: list[StreamToken] = []
    via_sdk = await HecateClient(client).infer(
        MODEL, "The capital of France is", max_tokens=8, on_token=seen.append
    )
    assert via_sdk.output == reply.output
    assert "".join(t.text for t in seen) == reply.output
    # A stop string ends the generation before it.
    stopped = await ask(
        client, InferRequest(prompt="The capital of France is", max_tokens=8, stop=["."])
    )
    assert stopped.output == " Paris"
    # Chat messages are rendered with the model's template on the first stage.
    messages = [ChatMessage(role="user", content="What is the capital of France?")]
    chat = await ask(client, InferRequest(prompt="", messages=messages, max_tokens=12))
    assert chat.ok, chat.error
    rendered = chat_prompt([("user", messages[0].content)])
    assert chat.output == reference(rendered, 12)
    # The prompt the nodes ran was the template's rendering (what it answers depends on
    # the CPU's int8 kernels: "Paris" on some, "L'Étoile, la Mar..." on others).
    assert chat.prompt_tokens == len(load_tokenizer(pull(MODEL)).encode(rendered).ids)
    await two_tenants_one_request_id_keep_their_own_sessions(client)


async def two_tenants_one_request_id_keep_their_own_sessions(client: Client) -> None:
    """Two tenants generating at once under the same request_id (a caller chooses it)
    each get their own text, and the nodes' sessions are named by neither: a session
    named by the id would let one tenant's first step drop the other's caches, or a
    step land on the other's cache when the positions happened to agree."""
    sessions: set[str] = set()

    async def on_stage(msg: Msg) -> None:
        stage = msgspec.msgpack.decode(msg.data)
        if "session" in stage:
            sessions.add(stage["session"])

    watch = await client.subscribe(subjects.node_run("*"), cb=on_stage)
    await settled(client)
    prompts = {"tenant-a": "The capital of France is", "tenant-b": "One, two, three, four,"}
    replies = await asyncio.gather(
        *(
            ask(client, InferRequest(prompt=p, max_tokens=8, tenant=t, request_id="shared-id"))
            for t, p in prompts.items()
        )
    )
    await watch.unsubscribe()
    for reply, prompt in zip(replies, prompts.values(), strict=True):
        assert reply.ok, reply.error
        assert reply.output == reference(prompt, 8)
    assert len(sessions) == 2, sessions
    assert not any("shared-id" in s for s in sessions), sessions


# make test kills during the prefill, at the first step and mid-decode, across both
# dispatch modes; make test-heavy adds the other half of the grid (about 40 s of SmolLM2
# swarms on two cores), which takes the same replay path.
_HEAVY = pytest.mark.heavy


@pytest.mark.parametrize(
    ("kill_after", "dispatch"),
    [
        (0, "hop"),
        pytest.param(1, "hop", marks=_HEAVY),
        (12, "hop"),
        pytest.param(0, "chain", marks=_HEAVY),
        (1, "chain"),
        pytest.param(12, "chain", marks=_HEAVY),
    ],
)
async def test_a_node_killed_mid_generation_is_replayed_and_the_text_is_unchanged(
    processes: Processes, client: Client, tmp_path: Path, kill_after: int, dispatch: str
) -> None:
    # Chained, the stages forward each step's hidden state to each other; a dead stage
    # is heard as no-responders on the reply subject of its own position in the chain.
    start(processes, tmp_path, ["a", "b", "c", "d", "e", "f"], pipelines=2, dispatch=dispatch)
    await ready(client)
    prompt, n = "Once upon a time, in a small village,", 24
    expected = reference(prompt, n)
    events: list[FailoverEvent] = []

    async def on_failover(msg: Msg) -> None:
        events.append(msgspec.json.decode(msg.data, type=FailoverEvent))

    await client.subscribe(subjects.EVENT_FAILOVER, cb=on_failover)
    # The route a generation takes is not known before it starts (the router weighs
    # measured stage times), so the victim is the middle node its own stage requests
    # went to: killed once ``kill_after`` tokens have streamed and the middle stage has
    # had the generation's work, so the kill always hits it.
    middles = await middle_stages(client)
    stream: list[StreamToken] = []
    task = asyncio.create_task(generate(client, prompt, n, stream))
    while (len(stream) < kill_after or not middles) and not task.done():
        await asyncio.sleep(0.002)  # polling what the bus has carried so far
    assert middles, "the generation ended before its middle stage was seen"
    victim = middles[-1]
    processes.kill(f"node-{victim}", signal.SIGKILL)
    reply = await task
    assert reply.ok, reply.error
    assert reply.output == expected  # greedy with a kill == greedy without one
    assert "".join(t.text for t in stream) == expected  # one uninterrupted stream
    assert reply.route is not None
    assert victim not in [s.node_id for s in reply.route.stages]
    assert any(e.lost_node == victim and e.kind == "replica" for e in events), events
    # Neither the lost route's session (released at the failover, a reply back or not)
    # nor the rescue's (released with the answer) stays on a surviving node.
    survivors = [n for n in "abcdef" if n != victim]
    held: dict[str, object] = {}

    async def released() -> bool:
        for n in survivors:
            data = endpoint_data(await stats(client, "node", n), "run")
            held[n] = data and data["sessions"]
        return all(v == 0 for v in held.values())

    await until(released, "every surviving node dropped the generation's sessions", last=held)


async def test_past_the_migration_limit_the_error_carries_the_text_so_far(
    processes: Processes, client: Client, tmp_path: Path
) -> None:
    # Two replicas, but no replay allowed: the rescue exists, the limit says no.
    nodes = ["a", "b", "c", "d", "e", "f"]
    start(processes, tmp_path, nodes, pipelines=2, router_args=("--max-replays", "0"))
    await ready(client)
    prompt, n = "Once upon a time, in a small village,", 24
    expected = reference(prompt, n)
    middles = await middle_stages(client)  # the node this generation really runs on
    stream: list[StreamToken] = []
    task = asyncio.create_task(generate(client, prompt, n, stream))
    while (len(stream) < 3 or not middles) and not task.done():
        await asyncio.sleep(0.002)  # polling what the bus has carried so far
    assert middles, "the generation ended before its middle stage was seen"
    victim = middles[-1]
    processes.kill(f"node-{victim}", signal.SIGKILL)
    reply = await task
    assert not reply.ok
    assert reply.error is not None
    assert reply.error.code == "unrecoverable"
    assert "migration limit" in reply.error.message
    assert reply.output  # the text so far, a prefix of the whole greedy text
    assert expected.startswith(reply.output)
    assert reply.output == "".join(t.text for t in stream)


async def test_the_numpy_reference_s_three_stages_generate_its_single_process_text(
    processes: Processes, client: Client, tmp_path: Path
) -> None:
    """Nodes running the float32 numpy model (--executor smollm2-numpy), the reference
    the engine is tested against, two pipelines of three stages, chained: the text is
    numpy's own in one process (the engine's int8 activations may part from it at a
    near-tie; each is held to itself)."""
    nodes = ["a", "b", "c", "d", "e", "f"]
    start(processes, tmp_path, nodes, pipelines=2, dispatch="chain", executor="smollm2-numpy")
    await ready(client)
    prompt, n = "Once upon a time, in a small village,", 24
    stream: list[StreamToken] = []
    reply = await generate(client, prompt, n, stream)
    assert reply.ok, reply.error
    assert reply.output == reference(prompt, n, engine="numpy")
    assert "".join(t.text for t in stream) == reply.output
