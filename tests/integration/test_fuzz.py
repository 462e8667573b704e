"""Bad input on every subject a service listens on, against a running swarm.

hypothesis draws the corpus: random bytes, JSON and msgpack of arbitrary shapes,
objects with the right field names and wrong values, huge strings, payloads over the
size limit, and garbage trace headers. Each is sent to every subject; where a reply is
expected it must be a typed error (``ok`` false, a code and a message) or a valid
answer, within the timeout. Afterwards every service is still up and answers $SRV.PING,
none has grown past a memory bound, no log holds a stack trace, each kind of rejection
is logged once (the counters carry the rest), and a good request is still served.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.client import Client

from hecate.model import reference
from hecate.wire import subjects

from .conftest import EXAMPLES, SWARM_NODES, Processes, infer, start_swarm, wait_until_serving

FIELDS = [
    "prompt", "max_tokens", "tenant", "request_id", "model_id", "layer_start", "layer_end",
    "activation", "node_id", "seq", "target", "ok", "code", "tokens", "messages", "stop",
    "profile", "capacity_layers", "chain", "session", "position", "attempt", "quota_ticket",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)
lookalikes = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6)


def _json(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


payloads = st.one_of(
    st.binary(max_size=512),
    json_values.map(_json),
    lookalikes.map(_json),
    lookalikes.map(lambda v: msgspec.msgpack.encode(v) if _finite(v) else b"\xc1"),
    st.just(b"{" * 10_000),
    st.just(_json({"prompt": "x" * 300_000})),  # over the router's request limit
    st.just(b"\x00" * 2_000_000),  # over the server's max_payload: refused by NATS itself
)
headers = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"traceparent": st.text(max_size=80), "tracestate": st.text(max_size=80)}
    ),
)


def _finite(value: Any) -> bool:
    try:
        msgspec.msgpack.encode(value)
        return True
    except (TypeError, OverflowError, ValueError):
        return False


def _corpus(n: int) -> list[tuple[bytes, dict[str, str] | None]]:
    drawn: list[tuple[bytes, dict[str, str] | None]] = []

    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(payloads, headers)
    def draw(payload: bytes, header: dict[str, str] | None) -> None:
        drawn.append((payload, header))

    draw()
    return drawn


# Subjects that answer (request/reply) and those that only listen.
REQUEST_REPLY = [
    subjects.infer("ncm-base"),
    subjects.infer("no-such-model"),
    "hecate.infer.Not_A-slug!",
    subjects.node_run("gpu"),
    subjects.QUOTA_ACQUIRE,
    subjects.BREAKER_PROBE,
    subjects.ROUTER_RETRIES,
]
LISTEN_ONLY = [
    subjects.heartbeat("gpu"),
    subjects.heartbeat("nobody"),
    subjects.node_join("gpu"),
    subjects.node_join("nobody"),
    subjects.node_leave("gpu"),
    subjects.node_leave("nobody"),
    subjects.NODE_ROLL_CALL,
    subjects.breaker_report("gpu"),
    subjects.EVENT_NODE_DOWN,
    subjects.ROUTER_CANCEL,
    subjects.node_release("gpu"),
]
SERVICES = ["telemetry", "planner", "breaker", "router-1", *[f"node-{n}" for n, *_ in SWARM_NODES]]


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def test_every_subject_survives_bad_input_and_answers_typed_errors(
    processes: Processes, client: Client
) -> None:
    start_swarm(processes, EXAMPLES / "swarm.json", SWARM_NODES)
    processes.start("breaker", "breaker", "--id", "breaker")
    await wait_until_serving(client, "ncm-base")
    corpus = _corpus(150)
    rss_before = {label: _rss_kb(processes.procs[label].pid) for label in SERVICES}

    for subject in REQUEST_REPLY:
        for payload, header in corpus:
            if len(payload) > 1024 * 1024:
                continue  # the server refuses it before any service sees it (below)
            msg = await client.request(subject, payload, timeout=5, headers=header)
            try:
                body = msgspec.json.decode(msg.data)
            except msgspec.DecodeError:
                body = msgspec.msgpack.decode(msg.data)
            if isinstance(body, dict) and body.get("ok") is False:
                error = body["error"]
                assert error["code"], (subject, body)
                assert error["message"], (subject, body)
                assert "Traceback" not in error["message"]
                assert msg.headers is not None
                assert msg.headers.get("Hecate-Error") == error["code"]
    for subject in LISTEN_ONLY:
        for payload, header in corpus:
            if len(payload) <= 1024 * 1024:
                await client.publish(subject, payload, headers=header)
        await client.flush()
    # Over the server's max_payload, NATS itself refuses (the publisher gets an error).
    with pytest.raises(Exception, match=r"(?i)payload"):
        await client.publish(subjects.infer("ncm-base"), b"\x00" * 2_000_000)
    await asyncio.sleep(1.0)

    # Everyone is still up and answering.
    for label in SERVICES:
        assert processes.procs[label].poll() is None, (
            f"{label} died: {processes.log(label)[-2000:]}"
        )
    pings = await _pings(client)
    assert len(pings) >= len(SERVICES), pings
    # Memory stayed bounded (no corpus kept, no unbounded queues).
    for label, before in rss_before.items():
        after = _rss_kb(processes.procs[label].pid)
        assert after < before + 64 * 1024, (label, before, after)
    # No stack trace in any log; each kind of rejection logged once per endpoint.
    for label in SERVICES:
        log = processes.log(label)
        assert "Traceback" not in log, (label, log[-3000:])
        rejections = [json.loads(line) for line in log.splitlines() if '"request rejected"' in line]
        kinds = [(r.get("endpoint"), r.get("code")) for r in rejections]
        assert len(kinds) == len(set(kinds)), (label, kinds)
    # And a good request is still served, right.
    reply = await infer(client, "ncm-base", "still there?")
    assert reply.ok, reply.error
    assert reply.output == reference("ncm-base", 12, "still there?", 8)


async def _pings(client: Client) -> list[bytes]:
    inbox = client.new_inbox()
    got: list[bytes] = []

    async def on_pong(msg: Any) -> None:
        got.append(msg.data)

    sub = await client.subscribe(inbox, cb=on_pong)
    await client.publish("$SRV.PING", b"", reply=inbox)
    await asyncio.sleep(0.5)
    await sub.unsubscribe()
    return got
