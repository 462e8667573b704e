"""The router's policy, pure: usable nodes, the route of a new request, the rescue of one
in flight, admission fullness. Driven with a fake clock; no bus."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hecate.core import (
    FailoverOptions,
    ModelSpec,
    NodeProfile,
    NodeState,
    NoHealthyPipeline,
    Recovered,
    Route,
    RoutingRequest,
    Swarm,
    SwarmConfig,
    SwarmPlan,
    Unrecoverable,
)
from hecate.core.chooser import Chooser
from hecate.core.errors import Saturated
from hecate.wire.messages import NodeTelemetry
from hecate_router.fold import telemetry_nodes
from tests.support.builders import pipeline, plan

REQ = RoutingRequest(tokens=8)
RACKS = ("a", "b", "c")
# Three copies of a 12-layer model in three 4-layer stages on the same boundaries (any
# copy's stage can stand in for another's), and a 4-layer reserve model on ``r``.
PLAN: SwarmPlan = plan(
    [
        *(
            pipeline(f"m-r{i}", "m", *((f"{x}{k}", 4 * k, 4 * k + 4) for k in range(3)))
            for i, x in enumerate(RACKS)
        ),
        pipeline("mini-r0", "mini", ("r", 0, 4)),
    ],
    models=[
        ModelSpec(model_id="m", layers=12),
        ModelSpec(model_id="mini", layers=4, role="reserve"),
    ],
)
NODES = tuple(n.node_id for n in PLAN.nodes)
DEGRADE = FailoverOptions(allow_degraded=True, reserve_model="mini")


def chooser(
    *,
    dead: frozenset[str] = frozenset(),
    suspected: frozenset[str] = frozenset(),
    open_circuits: frozenset[str] = frozenset(),
    leased: frozenset[str] = frozenset(),
    options: FailoverOptions = DEGRADE,
    now: float = 100.0,
) -> Chooser:
    c = Chooser(options, suspect_s=5.0)
    for node_id in suspected:
        c.suspect(node_id, now)
    nodes = {n: NodeState(alive=n not in dead, last_seen=50.0) for n in NODES}
    c.observe(PLAN, nodes, now=now, open_circuits=open_circuits, leased=leased)
    return c


subsets = st.frozensets(st.sampled_from(NODES))


def usable(n: str, dead: frozenset[str], open_: frozenset[str], leased: frozenset[str]) -> bool:
    return n not in dead and (n not in open_ or n in leased)


def intact(ok: set[str]) -> bool:
    """Some planned copy of the base model has every node usable."""
    return any(all(f"{x}{k}" in ok for k in range(3)) for x in RACKS)


def every_stage_held(ok: set[str]) -> bool:
    """Some usable node holds each of the base model's three stages: a splice exists."""
    return all(any(f"{x}{k}" in ok for x in RACKS) for k in range(3))


@settings(max_examples=300, deadline=None)
@given(dead=subsets, suspected=subsets, open_=subsets, leased=subsets, degrade=st.booleans())
def test_a_chosen_route_avoids_every_unusable_node_and_degrades_only_as_a_last_resort(
    dead: frozenset[str],
    suspected: frozenset[str],
    open_: frozenset[str],
    leased: frozenset[str],
    degrade: bool,
) -> None:
    options = DEGRADE if degrade else FailoverOptions()
    c = chooser(dead=dead, suspected=suspected, open_circuits=open_, leased=leased, options=options)
    ok = {n for n in NODES if usable(n, dead, open_, leased)}
    alive = {n for n in NODES if n not in dead}
    try:
        route, degraded = c.choose("m", REQ)
    except NoHealthyPipeline:
        # No copy, splice or reserve around the suspected nodes, and none either when
        # they are trusted again, nor through the open circuits.
        assert not every_stage_held(ok - suspected)
        assert not (degrade and "r" in ok - suspected)
        assert not intact(ok)
        assert not every_stage_held(ok)
        assert not (degrade and "r" in ok)
        assert not every_stage_held(alive)
        assert not (degrade and "r" in alive)
        return
    assert set(route.node_ids) <= alive  # never a dead node
    if not set(route.node_ids) <= ok:
        # Through an open circuit only when nothing else is left (rule 5).
        assert not every_stage_held(ok)
        assert not (degrade and "r" in ok)
        return
    if set(route.node_ids) & suspected:
        # Suspicion only steers: a suspected node is used when nothing avoids them all,
        # and then as without suspicion: a planned copy, else a splice, else the reserve.
        assert not every_stage_held(ok - suspected)
        assert not (degrade and "r" in ok - suspected)
        if route.model_id == "m":
            assert route.pipeline_id.endswith("~splice") == (not intact(ok))
        else:
            assert not every_stage_held(ok)
    assert degraded == (route.model_id == "mini")
    if degraded:
        assert degrade
        assert not every_stage_held(ok - suspected)  # no base copy and no splice
    else:
        assert route.model_id == "m"
        assert [(s.layer_start, s.layer_end) for s in route.stages] == [(0, 4), (4, 8), (8, 12)]


@settings(max_examples=300, deadline=None)
@given(
    dead=subsets,
    suspected=subsets,
    open_=subsets,
    copy=st.sampled_from(RACKS),
    stage=st.integers(0, 2),
    degrade=st.booleans(),
)
def test_a_rescue_never_reuses_the_lost_node_nor_an_unusable_one(
    dead: frozenset[str],
    suspected: frozenset[str],
    open_: frozenset[str],
    copy: str,
    stage: int,
    degrade: bool,
) -> None:
    c = chooser(
        dead=dead,
        suspected=suspected,
        open_circuits=open_,
        options=DEGRADE if degrade else FailoverOptions(),
    )
    p = next(p for p in PLAN.pipelines if p.pipeline_id == f"m-r{RACKS.index(copy)}")
    route = Route(model_id="m", pipeline_id=p.pipeline_id, cost=0.0, stages=p.stages)
    lost = p.stages[stage].node_id
    result = c.rescue(route, lost, REQ)
    if isinstance(result, Unrecoverable):
        assert result.lost_node == lost
        return
    assert isinstance(result, Recovered)
    assert lost not in result.route.node_ids
    ok = {n for n in NODES if c.usable(n)} - {lost}
    if not all(c.usable(n) for n in result.route.node_ids):
        # Through an open circuit only when nothing else is left (rule 5).
        assert all(n not in dead for n in result.route.node_ids)
        assert not every_stage_held(ok)
        return
    if result.kind == "degraded":
        assert degrade
        assert result.route.model_id == "mini"
        assert not every_stage_held(ok)
    else:
        assert result.route.model_id == "m"


@settings(max_examples=200, deadline=None)
@given(dead=subsets, full=st.frozensets(st.sampled_from(("m-r0", "m-r1", "m-r2"))))
def test_load_makes_a_request_wait_never_splice_or_degrade(
    dead: frozenset[str], full: frozenset[str]
) -> None:
    c = chooser(dead=dead)
    whole = {f"m-r{i}" for i, x in enumerate(RACKS) if not {f"{x}{k}" for k in range(3)} & dead}
    assert c.saturated("m", full) == (bool(whole) and whole <= full)
    if whole and whole <= full:
        with pytest.raises(Saturated):
            c.choose("m", REQ, full)
    elif whole:
        route, degraded = c.choose("m", REQ, full)
        assert route.pipeline_id in whole - full
        assert not degraded


def test_a_probe_lease_opens_an_open_circuit_to_this_router_alone() -> None:
    open_ = frozenset({"a0", "b0"})
    route, _ = chooser(open_circuits=open_, options=FailoverOptions()).choose("m", REQ)
    assert route.pipeline_id == "m-r2"
    route, _ = chooser(open_circuits=open_, leased=frozenset({"b0"})).choose("m", REQ)
    assert route.pipeline_id == "m-r1"  # the lease is spent: the probe goes out


def test_a_held_probe_lease_takes_the_next_request_that_can_carry_it() -> None:
    # m-r0 is the cheapest as costed; the circuit of m-r1's b1 waits for its probe.
    c = chooser(open_circuits=frozenset({"b1"}), leased=frozenset({"b1"}))
    route, degraded = c.choose("m", REQ)
    assert (route.pipeline_id, degraded) == ("m-r1", False)
    # Full, the pipeline through it is passed over; nothing else changes.
    route, _ = c.choose("m", REQ, frozenset({"m-r1"}))
    assert route.pipeline_id == "m-r0"
    # Another model's requests never carry it.
    route, _ = c.choose("mini", REQ)
    assert route.pipeline_id == "mini-r0"
    # A lease on a circuit that has closed since is nothing to spend.
    c = chooser(leased=frozenset({"b1"}))
    assert c.choose("m", REQ)[0].pipeline_id == "m-r0"


def test_circuits_open_on_every_copy_never_refuse_a_model_telemetry_calls_alive() -> None:
    # Every first stage's circuit opened at once: the swarm was overloaded (every node
    # queueing past its stage deadline), not three nodes sick. Refusing every request
    # for the cooldown would turn load into an outage.
    open_ = frozenset({"a0", "b0", "c0"})
    route, degraded = chooser(open_circuits=open_, options=FailoverOptions()).choose("m", REQ)
    assert route.model_id == "m"
    assert not degraded
    # A splice around the open circuits still comes first.
    c = chooser(open_circuits=frozenset({"a0", "b1", "c2"}), options=FailoverOptions())
    route, _ = c.choose("m", REQ)
    assert not set(route.node_ids) & {"a0", "b1", "c2"}
    # And telemetry still has the last word: a dead node is never used.
    with pytest.raises(NoHealthyPipeline):
        chooser(dead=frozenset({"a0", "b0", "c0"}), options=FailoverOptions()).choose("m", REQ)


def test_a_suspicion_lapses_with_time_or_when_telemetry_hears_from_the_node() -> None:
    c = chooser(suspected=frozenset({"a1"}), now=100.0)
    assert not c.usable("a1")
    assert not c.lapsed(104.0)
    assert c.lapsed(106.0)
    c.expire(106.0)
    assert c.usable("a1")
    assert c.suspects == {}

    c = chooser(suspected=frozenset({"a1"}), now=100.0)
    nodes = {n: NodeState(last_seen=101.0 if n == "a1" else 50.0) for n in NODES}
    c.observe(PLAN, nodes, now=102.0)  # a heartbeat after the failure we saw
    assert c.usable("a1")
    assert c.suspects == {}


def test_only_suspicion_in_the_way_routes_where_telemetry_says() -> None:
    suspected = frozenset({"a0", "b0", "c0"})
    route, degraded = chooser(suspected=suspected, options=FailoverOptions()).choose("m", REQ)
    assert (route.pipeline_id, degraded) == ("m-r0", False)
    # With a reserve allowed, the reserve is preferred to a node we just saw fail.
    route, degraded = chooser(suspected=suspected).choose("m", REQ)
    assert (route.model_id, degraded) == ("mini", True)


def test_only_suspicion_in_the_way_splices_where_telemetry_says() -> None:
    # Every copy has a dead node and the only stand-ins for layers 0-4 are suspected:
    # telemetry alone says a splice serves, so suspicion must not refuse the model.
    dead = frozenset({"a1", "b2", "c1"})
    suspected = frozenset({"a0", "b0", "c0"})
    route, degraded = chooser(dead=dead, suspected=suspected, options=FailoverOptions()).choose(
        "m", REQ
    )
    assert not degraded
    assert route.pipeline_id.endswith("~splice")
    assert not dead & set(route.node_ids)
    assert [(s.layer_start, s.layer_end) for s in route.stages] == [(0, 4), (4, 8), (8, 12)]


def test_a_splice_for_new_requests_is_the_cheapest_of_every_broken_copy() -> None:
    route, degraded = chooser(dead=frozenset({"a0", "b1", "c2"})).choose("m", REQ)
    assert not degraded
    assert route.pipeline_id.endswith("~splice")
    assert not {"a0", "b1", "c2"} & set(route.node_ids)


def test_telemetry_folds_draining_as_not_usable_but_heard_from() -> None:
    nodes, heard = telemetry_nodes(
        {
            "a": NodeTelemetry(alive=True, draining=True, last_seen=7.0),
            "b": NodeTelemetry(alive=False, last_seen=3.0),
        }
    )
    assert (nodes["a"].alive, nodes["b"].alive) == (False, False)
    assert heard == {"a": 7.0}


# -- the in-memory swarm runs the same policy --------------------------------------------


def splice_swarm(options: FailoverOptions = FailoverOptions()) -> Swarm:  # noqa: B008
    profiles = [
        NodeProfile(node_id="rack1-a", capacity_layers=6, latency_ms=5.0, score=2.0),
        NodeProfile(node_id="rack1-b", capacity_layers=6, latency_ms=5.0, score=2.0),
        NodeProfile(node_id="rack2-a", capacity_layers=6, latency_ms=7.0, score=2.0),
        NodeProfile(node_id="rack2-b", capacity_layers=6, latency_ms=7.0, score=2.0),
    ]
    config = SwarmConfig(layers=12, pipelines=2, model_id="ncm-base", failover=options)
    return Swarm(profiles, config, policy=Chooser(options))


def test_a_swarm_with_the_chooser_routes_new_requests_as_the_router_does() -> None:
    swarm = splice_swarm()
    swarm.mark_down("rack1-b")
    splice = swarm.mark_down("rack2-a")
    assert isinstance(splice, Recovered)
    assert splice.kind == "splice"
    # The router serves new requests the cheapest splice of any broken copy (here the
    # same stages, found from r0), not the one the last failover happened to find.
    assert swarm.route().node_ids == splice.route.node_ids == ("rack1-a", "rack2-b")
    assert swarm.route().pipeline_id == "ncm-base-r0~splice"


def test_a_swarm_with_the_chooser_keeps_serving_the_reserve_and_says_it_is_degraded() -> None:
    mini = ModelSpec(model_id="mini", layers=4, role="reserve")
    options = FailoverOptions(allow_degraded=True, reserve_model="mini")
    config = SwarmConfig(layers=12, pipelines=1, models=(mini,), failover=options)
    swarm = Swarm(
        [NodeProfile(node_id=n, capacity_layers=c) for n, c in (("big", 12), ("small", 4))],
        config,
        policy=Chooser(options),
    )
    lost = swarm.mark_down("big")
    assert isinstance(lost, Recovered)
    assert (lost.kind, lost.degraded) == ("degraded", True)
    route, degraded = swarm.choose()
    assert (route.model_id, degraded) == ("mini", True)
