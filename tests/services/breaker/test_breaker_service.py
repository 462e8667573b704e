"""The breaker service against a real nats-server whose breaker bucket goes away: a
missing key is a closed circuit, a missing bucket is not, and no report is lost without
being counted and logged."""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError

from hecate.bus import kv as kvs
from hecate.bus.settle import settled
from hecate.resilience.breaker import BreakerSnapshot
from hecate.wire import subjects
from hecate.wire.messages import ErrorReply, NodeEvent, OutcomeReport, ProbeGrant, ProbeRequest
from tests.support.swarm import Processes
from tests.support.waits import endpoint_data, listening, stats, until


async def report_stats(client: Client) -> dict[str, Any] | None:
    """The breaker's ``report`` endpoint statistics, None until it serves them."""
    try:
        msg = await client.request("$SRV.STATS.hecate-breaker", b"", timeout=1)
    except Exception:
        return None
    doc = json.loads(msg.data)
    return next((e["data"] for e in doc["endpoints"] if e["name"] == "report"), None)


async def start_breaker(processes: Processes, client: Client, *args: str) -> None:
    processes.start("breaker", "breaker", "--id", "breaker", *args)

    async def serving() -> bool:
        return await report_stats(client) is not None

    await until(serving, "the breaker service never listed its report endpoint")


async def fail(client: Client, target: str, times: int = 1) -> None:
    for _ in range(times):
        report = OutcomeReport(target=target, ok=False, code="internal", router_id="test")
        await client.publish(subjects.breaker_report(target), msgspec.json.encode(report))
    await settled(client)


async def stored(client: Client, target: str) -> BreakerSnapshot | None:
    kv = await kvs.bucket(client, subjects.BREAKER_BUCKET)
    try:
        entry = await kv.get(target)
    except KeyNotFoundError:
        return None
    return msgspec.json.decode(entry.value or b"", type=BreakerSnapshot)


async def stat_is(client: Client, name: str, value: int) -> bool:
    data = await report_stats(client)
    return data is not None and data.get(name) == value


def warnings(processes: Processes, message: str) -> list[dict[str, Any]]:
    lines = [
        json.loads(line) for line in processes.log("breaker").splitlines() if line.startswith("{")
    ]
    return [r for r in lines if r.get("event") == message and r.get("level") == "warning"]


async def test_a_target_never_written_or_deleted_is_a_closed_circuit(
    processes: Processes, client: Client
) -> None:
    await start_breaker(processes, client)
    await fail(client, "fresh")

    async def written() -> bool:
        snap = await stored(client, "fresh")
        return snap is not None and len(snap.failures) == 1

    await until(written, "a failure on a fresh target is counted on a closed circuit")
    kv = await kvs.bucket(client, subjects.BREAKER_BUCKET)
    await kv.delete("fresh")
    await fail(client, "fresh")
    await until(written, "a deleted circuit starts closed again, with one failure")
    snap = await stored(client, "fresh")
    assert snap is not None
    assert snap.state == "closed"
    assert await stat_is(client, "kv_errors", 0)


async def test_reports_are_held_while_the_bucket_is_gone_and_applied_once_it_is_back(
    processes: Processes, client: Client
) -> None:
    await start_breaker(processes, client, "--failure-threshold", "3")
    await client.jetstream().delete_key_value(subjects.BREAKER_BUCKET)
    await fail(client, "gpu", times=3)

    async def all_held() -> bool:
        return await stat_is(client, "held", 3)

    await until(all_held, "the reports are held, not taken for a closed circuit")
    data = await report_stats(client)
    assert data is not None
    assert data["kv_errors"] >= 1
    assert data["dropped"] == 0
    assert warnings(processes, "breaker reports held")
    # Nothing is known of the circuit: the probe is refused with an error, not "closed".
    ask = msgspec.json.encode(ProbeRequest(target="gpu", router_id="test"))
    answer = await client.request(subjects.BREAKER_PROBE, ask, timeout=5)
    assert answer.headers is not None
    assert answer.headers.get("Hecate-Error") == "internal"
    assert not msgspec.json.decode(answer.data, type=ErrorReply).ok

    await kvs.bucket(client, subjects.BREAKER_BUCKET)  # the bucket is back

    async def opened() -> bool:
        snap = await stored(client, "gpu")
        return snap is not None and snap.state == "open"

    await until(opened, "the held failures open the circuit once the bucket is back")

    async def none_held() -> bool:
        return await stat_is(client, "held", 0)

    await until(none_held, "the backlog empties")
    assert await stat_is(client, "dropped", 0)


async def test_a_report_held_past_the_failure_window_is_dropped_counted_and_logged(
    processes: Processes, client: Client
) -> None:
    await start_breaker(processes, client, "--window-s", "0.5")
    await client.jetstream().delete_key_value(subjects.BREAKER_BUCKET)
    await fail(client, "gpu", times=2)

    async def both_dropped() -> bool:
        return await stat_is(client, "dropped", 2)

    await until(both_dropped, "reports older than the failure window are dropped")
    assert await stat_is(client, "held", 0)
    dropped = warnings(processes, "breaker report dropped")
    assert len(dropped) == 2, dropped  # every one logged
    assert all(r["target"] == "gpu" and "window" in r["reason"] for r in dropped)

    await kvs.bucket(client, subjects.BREAKER_BUCKET)
    await fail(client, "gpu")

    async def one_failure() -> bool:
        snap = await stored(client, "gpu")
        return snap is not None

    await until(one_failure, "a report after the bucket came back is applied")
    snap = await stored(client, "gpu")
    assert snap is not None
    assert len(snap.failures) == 1  # the dropped ones were not applied late


# -- a node heard again ------------------------------------------------------------------


async def report(client: Client, target: str, code: str, times: int) -> None:
    for _ in range(times):
        failure = OutcomeReport(target=target, ok=False, code=code, router_id="test")
        await client.publish(subjects.breaker_report(target), msgspec.json.encode(failure))
    await settled(client)


async def node_up(client: Client, node_id: str) -> None:
    up = NodeEvent(node_id=node_id, state="up", reason="heartbeat", at=time.time())
    await client.publish(subjects.EVENT_NODE_UP, msgspec.json.encode(up))
    await settled(client)


async def state_is(client: Client, target: str, state: str) -> bool:
    snap = await stored(client, target)
    return snap is not None and snap.state == state


async def test_a_circuit_its_nodes_silence_opened_is_probed_as_soon_as_the_node_is_back(
    processes: Processes, client: Client
) -> None:
    await start_breaker(processes, client, "--failure-threshold", "2", "--cooldown-s", "600")
    await listening(client, "breaker", "breaker", "node-up")
    await report(client, "alpha-0", "timeout", times=2)
    await report(client, "beta-0", "internal", times=2)
    for target in ("alpha-0", "beta-0"):

        async def opened(target: str = target) -> bool:
            return await state_is(client, target, "open")

        await until(opened, f"{target}'s circuit opens")

    await node_up(client, "beta-0")  # it answered errors: hearing it again is no news
    await node_up(client, "alpha-0")  # it did not answer: hearing it again is
    await until(lambda: state_is(client, "alpha-0", "half_open"), "alpha-0 half-open at once")
    assert await state_is(client, "beta-0", "open")  # its node-up was handled first
    assert await stat_is(client, "revived", 1)

    # The next router to ask gets the probe without waiting out the 600 s cooldown, and
    # its success closes the circuit.
    ask = msgspec.json.encode(ProbeRequest(target="alpha-0", router_id="test"))
    grant = msgspec.json.decode(
        (await client.request(subjects.BREAKER_PROBE, ask, timeout=5)).data, type=ProbeGrant
    )
    assert grant.granted
    ok = OutcomeReport(target="alpha-0", ok=True, router_id="test")
    await client.publish(subjects.breaker_report("alpha-0"), msgspec.json.encode(ok))
    await until(lambda: state_is(client, "alpha-0", "closed"), "the probe's success closes it")
    changes = [
        json.loads(line)
        for line in processes.log("breaker").splitlines()
        if line.startswith("{") and "node back" in line
    ]
    assert [(c["target"], c["event"]) for c in changes] == [("alpha-0", "breaker half_open")]


async def test_with_two_replicas_one_revives_the_circuit(
    processes: Processes, client: Client
) -> None:
    for replica in ("b1", "b2"):
        processes.start(replica, "breaker", "--id", replica, "--cooldown-s", "600")
        await listening(client, "breaker", replica, "node-up")
    await report(client, "alpha-0", "timeout", times=5)
    await until(lambda: state_is(client, "alpha-0", "open"), "alpha-0's circuit opens")

    await node_up(client, "alpha-0")  # both replicas hear it

    async def both_handled() -> bool:
        handled = 0
        for replica in ("b1", "b2"):
            doc = await stats(client, "breaker", replica)
            handled += sum(
                e["num_requests"]
                for e in (doc or {}).get("endpoints", [])
                if e["name"] == "node-up"
            )
        return handled == 2

    await until(both_handled, "both replicas handled the node-up")
    assert await state_is(client, "alpha-0", "half_open")
    revived = [
        int((endpoint_data(await stats(client, "breaker", r), "report") or {})["revived"])
        for r in ("b1", "b2")
    ]
    assert sorted(revived) == [0, 1], revived
