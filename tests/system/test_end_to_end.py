"""A plain nats-py client against a swarm of real processes on a real nats-server."""

from __future__ import annotations

import json

import msgspec
from nats.aio.client import Client

from hecate.model.toy import reference
from hecate.wire import subjects
from tests.support.swarm import (
    EXAMPLES,
    SWARM_NODES,
    Processes,
    infer,
    start_swarm,
    wait_until_serving,
)


async def test_answers_equal_the_single_process_reference(
    processes: Processes, client: Client
) -> None:
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES, routers=2)
    await wait_until_serving(client, "ncm-base")
    for prompt, tokens in [
        ("hello swarm", 8),
        ("a longer prompt, with punctuation!", 16),
        ("", 0),
        ("ünïcödé ✓", 4),
    ]:
        reply = await infer(client, "ncm-base", prompt, tokens)
        assert reply.ok, reply.error
        assert reply.output == reference("ncm-base", 12, prompt, tokens)
        # The toy model counts words: the first stage the prompt's, the last its own.
        assert (reply.prompt_tokens, reply.completion_tokens) == (len(prompt.split()), tokens)
        assert reply.route is not None
        assert reply.route.model_id == "ncm-base"
        assert (reply.degraded, reply.attempts) == (False, 1)
        assert reply.route.stages[0].layer_start == 0
        assert reply.route.stages[-1].layer_end == 12


async def test_bad_input_gets_a_typed_error_reply_never_silence(
    processes: Processes, client: Client
) -> None:
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES)
    await wait_until_serving(client, "ncm-base")

    async def ask(subject: str, body: bytes) -> tuple[dict[str, object], dict[str, str]]:
        msg = await client.request(subject, body, timeout=5)
        return json.loads(msg.data), dict(msg.headers or {})

    cases = [
        (subjects.infer("ncm-base"), b"{not json", "bad_request"),
        (subjects.infer("ncm-base"), b'{"prompt": 42}', "bad_request"),
        (subjects.infer("ncm-base"), b'{"max_tokens": 3}', "bad_request"),
        (subjects.infer("ncm-base"), b'{"prompt": "x", "max_tokens": -1}', "bad_request"),
        (subjects.infer("ncm-base"), b'{"prompt": "' + b"x" * 300_000 + b'"}', "payload_too_large"),
        (subjects.infer("Not-A-Slug"), b'{"prompt": "x"}', "bad_request"),
        ("hecate.infer.two.tokens", b'{"prompt": "x"}', "bad_request"),
        (subjects.infer("no-such-model"), b'{"prompt": "x"}', "no_such_model"),
    ]
    for subject, body, code in cases:
        doc, headers = await ask(subject, body)
        assert doc["ok"] is False, (subject, doc)
        error = doc["error"]
        assert isinstance(error, dict)
        assert error["code"] == code, (subject, body[:40], doc)
        assert "Traceback" not in str(error["message"])
        assert headers["Hecate-Error"] == code
        assert headers["Nats-Service-Error-Code"].isdigit()
    # Unknown fields are ignored (forward compatible).
    doc, _ = await ask(subjects.infer("ncm-base"), b'{"prompt": "hi", "future_field": [1]}')
    assert doc["ok"] is True
    # Node subjects answer garbage with a typed error too.
    msg = await client.request(subjects.node_run("gpu"), b"\xc1garbage", timeout=5)
    stage = msgspec.msgpack.decode(msg.data)
    assert stage["ok"] is False
    assert stage["error"]["code"] == "bad_request"


async def test_services_announce_themselves_on_the_service_api(
    processes: Processes, client: Client
) -> None:
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES)
    await wait_until_serving(client, "ncm-base")
    inbox = client.new_inbox()
    sub = await client.subscribe(inbox)
    await client.publish("$SRV.PING", b"", reply=inbox)
    names = set()
    try:
        while True:
            msg = await sub.next_msg(timeout=0.5)
            doc = json.loads(msg.data)
            assert doc["type"] == "io.nats.micro.v1.ping_response"
            names.add((doc["name"], doc["id"]))
    except Exception:
        pass
    assert {
        ("hecate-router", "router-1"),
        ("hecate-planner", "planner"),
        ("hecate-telemetry", "telemetry"),
        ("hecate-node", "gpu"),
    } <= names
    info = await client.request("$SRV.INFO.hecate-router", b"", timeout=2)
    endpoints = json.loads(info.data)["endpoints"]
    assert {
        "name": "infer",
        "subject": "hecate.infer.>",
        "queue_group": "hecate-routers",
        "metadata": {},
    } in endpoints
