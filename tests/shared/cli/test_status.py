"""``hecate status`` calls a pipeline servable only when the routers would send to it:
every node heard, none draining, none behind a circuit that is not closed."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from hecate.cli.client import render
from hecate.resilience.breaker import BreakerSnapshot
from hecate.wire.messages import NodeTelemetry, TelemetrySnapshot
from tests.support.builders import pipeline, plan

PLAN = plan(
    [
        pipeline("m-r0", "m", ("alpha-0", 0, 2), ("beta-0", 2, 4)),
        pipeline("m-r1", "m", ("alpha-1", 0, 2), ("beta-1", 2, 4)),
    ]
)
NODES = ("alpha-0", "alpha-1", "beta-0", "beta-1")


def info(
    *,
    down: tuple[str, ...] = (),
    draining: tuple[str, ...] = (),
    circuits: dict[str, BreakerSnapshot] | None = None,
    routers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """What ``gather`` reads off the bus; ``circuits=None``: the bucket was unreadable."""
    now = time.time()
    telemetry = TelemetrySnapshot(
        written_at=now,
        nodes={
            n: NodeTelemetry(alive=n not in down, last_seen=now, draining=n in draining)
            for n in NODES
        },
    )
    return {
        "plan": msgspec.json.encode(PLAN),
        "epoch": 1,
        "telemetry": msgspec.json.encode(telemetry),
        "breakers": None
        if circuits is None
        else {t: msgspec.json.encode(s) for t, s in circuits.items()},
        "routers": routers or [],
    }


def headline(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("swarm: "))


def opened(until: float = 60.0) -> BreakerSnapshot:
    return BreakerSnapshot(state="open", open_until=time.time() + until, cause="internal")


def test_every_node_heard_and_every_circuit_closed_is_healthy() -> None:
    closed = {"alpha-0": BreakerSnapshot(failures=(1.0,))}  # a streak is not an opening
    assert headline(render(info(circuits=closed))) == (
        "swarm: healthy (2/2 pipelines servable; 2/2 intact, 4/4 nodes alive)"
    )


def test_open_circuits_on_every_first_stage_make_no_pipeline_servable() -> None:
    # Every node alive, every pipeline intact, every circuit of a first stage open: the
    # routers' last resort serves through them, and the status says so.
    text = render(info(circuits={"alpha-0": opened(), "alpha-1": opened()}))
    assert headline(text) == (
        "swarm: degraded (0/2 pipelines servable: circuits open on alpha-0, alpha-1; "
        "2/2 intact, 4/4 nodes alive; routers serve through the open circuits)"
    )
    assert "  m-r0            blocked   alpha-0[0:2] -> beta-0[2:4]" in text
    assert any(line.startswith("alpha-0") and line.endswith("OPEN") for line in text.splitlines())


def test_a_half_open_circuit_blocks_all_but_its_probe() -> None:
    half = BreakerSnapshot(state="half_open", probe_started=time.time())
    assert headline(render(info(circuits={"beta-1": half}))) == (
        "swarm: degraded (1/2 pipelines servable: probing beta-1; 2/2 intact, 4/4 nodes alive)"
    )


def test_down_and_draining_nodes_are_named_too() -> None:
    text = render(info(down=("alpha-0",), draining=("beta-1",), circuits={}))
    assert headline(text) == (
        "swarm: degraded (0/2 pipelines servable: down: alpha-0; draining beta-1; "
        "1/2 intact, 3/4 nodes alive)"
    )
    assert "  m-r0            BROKEN    alpha-0[0:2] -> beta-0[2:4]" in text


def test_without_the_breaker_bucket_the_routers_view_of_the_circuits_is_used() -> None:
    router = {
        "id": "r1",
        "endpoints": [{"name": "infer", "data": {"breakers_open": ["beta-0"]}}],
    }
    assert headline(render(info(circuits=None, routers=[router]))) == (
        "swarm: degraded (1/2 pipelines servable: circuits open on beta-0; "
        "2/2 intact, 4/4 nodes alive)"
    )


def test_no_node_heard_is_a_failed_swarm() -> None:
    assert headline(render(info(down=NODES, circuits={}))).startswith("swarm: failed (0/2")
