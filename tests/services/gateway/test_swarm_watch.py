"""The gateway's swarm watch without a bus: what the plan, telemetry, breaker values and
events it is handed turn into (the page's JSON, the feed, the swarm gauges), and the
page's event stream (a state on connect, feed lines as they come, states after)."""

from __future__ import annotations

import json

import msgspec
from prometheus_client import CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from hecate.core import Route, Stage
from hecate.resilience.breaker import BreakerSnapshot
from hecate.wire import subjects
from hecate.wire.messages import (
    BreakerChanged,
    FailoverEvent,
    NodeEvent,
    NodeTelemetry,
    PlanChanged,
    ServiceRestarted,
    TelemetrySnapshot,
)
from hecate_gateway import page
from hecate_gateway.swarm import SwarmWatch
from tests.support.builders import pipeline, plan

PLAN = plan(
    [
        pipeline("m-r0", "m", ("a", 0, 2), ("b", 2, 4)),
        pipeline("m-r1", "m", ("c", 0, 4)),
    ]
)
enc = msgspec.json.encode


def telemetry(**alive: bool) -> TelemetrySnapshot:
    return TelemetrySnapshot(
        written_at=10.0,
        nodes={n: NodeTelemetry(alive=up, last_seen=10.0, load=0.5) for n, up in alive.items()},
    )


def failover(lost: str, kind: str = "replica", at: float = 100.0) -> bytes:
    old = Route(model_id="m", pipeline_id="m-r0", cost=1.0, stages=PLAN.pipelines[0].stages)
    new = Route(
        model_id="m",
        pipeline_id="m-r1",
        cost=1.0,
        stages=(Stage(node_id="c", layer_start=0, layer_end=4),),
    )
    return enc(
        FailoverEvent(
            request_id="r1",
            model_id="m",
            lost_node=lost,
            kind=kind,  # type: ignore[arg-type]
            old_route=old,
            new_route=new,
            attempt=1,
            reason="no responders",
            router_id="router-1",
            at=at,
        )
    )


def watching() -> SwarmWatch:
    watch = SwarmWatch(clock=lambda: 123.0, tick=lambda: 50.0)
    watch.adopt_plan(PLAN, 4)
    watch.adopt_telemetry(telemetry(a=True, b=False, c=True))
    return watch


def test_the_state_is_the_plan_over_telemetry_and_circuits() -> None:
    watch = SwarmWatch()
    assert not watch.has_plan
    assert watch.servable_models() == []
    watch = watching()
    assert watch.has_plan
    doc = watch.snapshot()
    assert doc["epoch"] == 4
    assert {n["node_id"]: n["health"] for n in doc["nodes"]} == {"a": "up", "b": "down", "c": "up"}
    (m,) = doc["models"]
    assert [p["servable"] for p in m["pipelines"]] == [False, True]
    assert m["live_replicas"] == [2, 2, 1, 1]
    assert doc["servable_models"] == ["m"] == watch.servable_models()
    json.dumps(doc)  # plain JSON all the way down

    open_c = enc(BreakerSnapshot(state="open", open_until=200.0, trips=1))
    assert watch.adopt_circuit("c", open_c)
    assert watch.servable_models() == []
    assert watch.adopt_circuit("c", None)  # the key deleted: closed again
    assert watch.servable_models() == ["m"]
    watch.adopt_plan(None, 5)  # the plan deleted: nothing to serve by
    assert watch.epoch == 0
    assert not watch.has_plan


def test_events_fill_the_feed_and_the_tallies() -> None:
    watch = watching()
    for i in range(3):
        assert watch.take(subjects.EVENT_FAILOVER, failover("b", at=100.0 + i))
    down = NodeEvent(node_id="b", state="down", reason="silent for 480 ms", at=104.0)
    assert watch.take(subjects.EVENT_NODE_DOWN, enc(down))
    tripped = BreakerChanged(
        target="b", state="open", open_until=164.0, reason="5 failures", at=105
    )
    assert watch.take(subjects.EVENT_BREAKER, enc(tripped))
    changed = PlanChanged(
        epoch=5, strategy="greedy", planner_id="p", pipelines=2, reason="node left", at=106.0
    )
    assert watch.take(subjects.EVENT_PLAN, enc(changed))
    again = ServiceRestarted(label="router-1", exit_code=-9, restarts=1, delay_s=1.0, at=107.0)
    assert watch.take(subjects.EVENT_RESTARTED, enc(again))
    assert not watch.take("hecate.events.something-new", b"{}")
    assert not watch.take(subjects.EVENT_FAILOVER, b"nonsense")

    feed = watch.snapshot()["feed"]
    assert [(e["kind"], e["tag"], e["count"]) for e in feed] == [
        ("service", "restarted", 1),
        ("plan", "greedy", 1),
        ("breaker", "open", 1),
        ("node", "down", 1),
        ("failover", "replica", 3),
    ]
    assert feed[0]["text"] == "router-1 exited (-9) and was started again after 1 s (restart 1)"
    assert feed[2]["text"] == "circuit of b tripped open for 59 s (5 failures)"
    assert feed[4]["text"] == "m lost b: m-r0 -> m-r1 (no responders)"
    assert watch.snapshot()["counters"] == {"failovers": {"replica": 3}, "breaker_trips": 1}


def test_the_planners_reminders_mark_it_heard_and_add_no_feed_line() -> None:
    """The planner says its last notice again every few seconds (``previous`` = ``epoch``,
    nothing changed); in the feed, a minute of them pushed every real event out of view.
    A reminder only moves ``plan_heard``; a real change, before and after, is a line."""
    watch = watching()
    notice = PlanChanged(
        epoch=1, strategy="greedy", planner_id="p", pipelines=2, reason="members", at=50.0,
        previous=0, changed=("a", "b"),
    )  # fmt: skip
    assert watch.take(subjects.EVENT_PLAN, enc(notice))
    down = NodeEvent(node_id="b", state="down", reason="silent", at=51.0)
    assert watch.take(subjects.EVENT_NODE_DOWN, enc(down))
    rev = watch.snapshot()["feed_rev"]
    for i in range(24):  # two minutes of them
        reminder = msgspec.structs.replace(
            notice, previous=1, changed=(), reason="reminder", at=55.0 + 5 * i
        )
        version = watch.version
        assert watch.take(subjects.EVENT_PLAN, enc(reminder))
        assert watch.version > version  # the page's state says it
    doc = watch.snapshot()
    assert [(e["kind"], e["text"]) for e in doc["feed"]] == [
        ("node", "b down (silent)"),
        ("plan", "plan epoch 1: 2 pipelines (members)"),
    ]
    assert (doc["feed_rev"], watch.feed_since(rev)) == (rev, [])
    assert doc["plan_heard"] == 55.0 + 5 * 23
    # Before any plan, the planner says who it heard (epoch = previous too): no line.
    early = watching()
    members = PlanChanged(
        epoch=0, strategy="greedy", planner_id="p", pipelines=0, reason="members", at=9.0,
        previous=0, changed=(),
    )  # fmt: skip
    assert early.take(subjects.EVENT_PLAN, enc(members))
    assert (early.snapshot()["feed"], early.snapshot()["plan_heard"]) == ([], 9.0)
    # An older notice heard late does not set the mark back.
    late = msgspec.structs.replace(reminder, at=1.0)
    assert watch.take(subjects.EVENT_PLAN, enc(late))
    assert watch.snapshot()["plan_heard"] == 55.0 + 5 * 23
    # The next real change is a line again.
    nxt = msgspec.structs.replace(notice, epoch=2, previous=1, reason="node left", at=200.0)
    assert watch.take(subjects.EVENT_PLAN, enc(nxt))
    assert watch.snapshot()["feed"][0]["text"] == "plan epoch 2: 2 pipelines (node left)"
    assert watch.snapshot()["plan_heard"] == 200.0


def test_the_swarm_gauges_and_event_counters_on_a_registry() -> None:
    watch = watching()
    watch.take(subjects.EVENT_FAILOVER, failover("b"))
    watch.take(subjects.EVENT_FAILOVER, failover("b", kind="splice"))
    registry = CollectorRegistry()
    watch.register_metrics(registry)
    text = generate_latest(registry).decode()
    for line in [
        'hecate_swarm_nodes{health="up"} 2.0',
        'hecate_swarm_nodes{health="down"} 1.0',
        "hecate_swarm_plan_epoch 4.0",
        'hecate_swarm_pipelines_planned{model="m"} 2.0',
        'hecate_swarm_pipelines_complete{model="m"} 1.0',
        'hecate_swarm_pipelines_servable{model="m"} 1.0',
        'hecate_swarm_layer_min_live_replicas{model="m"} 1.0',
        'hecate_swarm_model_servable{model="m"} 1.0',
        'hecate_failovers_total{kind="replica"} 1.0',
        'hecate_failovers_total{kind="splice"} 1.0',
        "hecate_breaker_trips_total 0.0",
    ]:
        assert line in text.splitlines(), line
    watch.adopt_telemetry(telemetry(a=True, b=True, c=True))  # read at each scrape
    assert 'hecate_swarm_nodes{health="down"} 0.0' in generate_latest(registry).decode()


def test_the_page_and_the_json_are_served() -> None:
    watch = watching()
    with TestClient(Starlette(routes=page.routes(watch))) as http:
        html = http.get("/")
        assert html.status_code == 200
        assert html.headers["content-type"].startswith("text/html")
        assert 'new EventSource("v1/swarm/events")' in html.text
        doc = http.get("/v1/swarm")
        assert doc.headers["content-type"] == "application/json"
        assert doc.json() == json.loads(json.dumps(watch.snapshot()))


async def test_the_event_stream_sends_a_state_then_feed_lines_then_fresh_states() -> None:
    watch = watching()
    stream = page.stream(watch)
    first = (await anext(stream)).decode()
    assert first.startswith("retry: 1000\n\nevent: state\ndata: ")
    assert '"feed":[]' in first

    watch.take(subjects.EVENT_FAILOVER, failover("b"))
    chunk = (await anext(stream)).decode()
    events = [block for block in chunk.split("\n\n") if block]
    assert events[0].startswith("event: feed\ndata: ")
    line = json.loads(events[0].split("data: ", 1)[1])
    assert (line["kind"], line["node_id"], line["count"]) == ("failover", "b", 1)

    watch.adopt_telemetry(telemetry(a=True, b=True, c=True))
    while True:  # the state follows within the throttle, without its feed
        blocks = [b for b in (await anext(stream)).decode().split("\n\n") if b]
        states = [b for b in blocks if b.startswith("event: state")]
        if states:
            break
    doc = json.loads(states[-1].split("data: ", 1)[1])
    assert "feed" not in doc
    assert doc["nodes_down"] == 0
    assert doc["counters"]["failovers"] == {"replica": 1}
    await stream.aclose()


def test_the_watch_follows_every_event_the_contract_has() -> None:
    from hecate.wire import contract
    from hecate_gateway.swarm import EVENT_SUBJECTS

    events = {
        c.address
        for c in contract.CHANNELS
        if c.address and c.address.startswith(subjects.EVENTS_ALL[:-1])
    }
    assert set(EVENT_SUBJECTS) == events
