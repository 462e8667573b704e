"""The swarm lifecycle: route, lose nodes, get them back, fail over, grow, shrink, stop."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from hecate.core import (
    PLANNERS,
    DuplicateNode,
    FailoverOptions,
    InsufficientCapacity,
    ModelSpec,
    NodeProfile,
    NoHealthyPipeline,
    Recovered,
    Replacement,
    Route,
    RoutingError,
    Stage,
    Swarm,
    SwarmConfig,
    SwarmPlan,
    SwarmStopped,
    UnknownNode,
    Unrecoverable,
)
from hecate.core.plan import ModelRole, covers_exactly

PLANNER_NAMES = sorted(PLANNERS)


def nodes(**capacities: int) -> list[NodeProfile]:
    return [NodeProfile(node_id=n, capacity_layers=c) for n, c in capacities.items()]


def splice_swarm() -> Swarm:
    """examples/splice.json: two racks of two 6-layer nodes, a 12-layer model, 2 pipelines."""
    profiles = [
        NodeProfile(node_id="rack1-a", capacity_layers=6, latency_ms=5.0, score=2.0),
        NodeProfile(node_id="rack1-b", capacity_layers=6, latency_ms=5.0, score=2.0),
        NodeProfile(node_id="rack2-a", capacity_layers=6, latency_ms=7.0, score=2.0),
        NodeProfile(node_id="rack2-b", capacity_layers=6, latency_ms=7.0, score=2.0),
    ]
    return Swarm(profiles, SwarmConfig(layers=12, pipelines=2, model_id="ncm-base"))


def reserve_swarm(options: FailoverOptions, role: ModelRole = "reserve") -> Swarm:
    """A 12-layer base on ``big`` alone and a 4-layer ``mini`` model on ``small`` alone."""
    mini = ModelSpec(model_id="mini", layers=4, role=role)
    config = SwarmConfig(layers=12, pipelines=1, models=(mini,), failover=options)
    return Swarm(nodes(big=12, small=4), config)


def stages(route: Route) -> list[tuple[str, int, int]]:
    return [(s.node_id, s.layer_start, s.layer_end) for s in route.stages]


def nodes_in(plan: SwarmPlan) -> set[str]:
    return {n.node_id for n in plan.nodes} | {i for p in plan.pipelines for i in p.node_ids}


def held_by_plan(stage: Stage, model_id: str, plan: SwarmPlan) -> bool:
    """The plan gives ``stage``'s node every layer the stage asks it to run."""
    held = {
        layer
        for p in plan.pipelines_of(model_id)
        for s in p.stages
        if s.node_id == stage.node_id
        for layer in range(s.layer_start, s.layer_end)
    }
    return held >= set(range(stage.layer_start, stage.layer_end))


# -- mark_down: the route is computed before the node is marked ------------------------


def test_killing_a_node_on_the_current_route_fails_over_to_the_other_replica() -> None:
    swarm = splice_swarm()
    assert swarm.route().node_ids == ("rack1-a", "rack1-b")
    result = swarm.mark_down("rack1-b")
    assert isinstance(result, Recovered)
    assert result.kind == "replica"
    assert result.degraded is False
    assert result.replaced == ()
    assert result.route.model_id == "ncm-base"
    assert result.route.node_ids == ("rack2-a", "rack2-b")
    assert swarm.route().node_ids == ("rack2-a", "rack2-b")


def test_killing_a_node_off_the_current_route_leaves_the_route_unaffected() -> None:
    swarm = splice_swarm()
    before = swarm.route()
    result = swarm.mark_down("rack2-a")
    assert isinstance(result, Recovered)
    assert result.kind == "unaffected"
    assert result.degraded is False
    assert result.route == before
    assert not swarm.state.is_alive("rack2-a")


def test_marking_down_a_stranger_raises_unknown_node_and_changes_nothing() -> None:
    swarm = splice_swarm()
    with pytest.raises(UnknownNode):
        swarm.mark_down("ghost")
    assert swarm.status() == "healthy"
    assert sorted(swarm.state.live_nodes()) == ["rack1-a", "rack1-b", "rack2-a", "rack2-b"]


# -- status ----------------------------------------------------------------------------


def test_a_swarm_is_degraded_while_a_pipeline_has_a_node_down_and_healthy_once_it_is_back() -> None:
    swarm = splice_swarm()
    assert swarm.status() == "healthy"
    swarm.mark_down("rack2-b")
    assert swarm.status() == "degraded"
    swarm.mark_alive("rack2-b")
    assert swarm.status() == "healthy"


def test_a_swarm_fails_only_when_no_node_is_alive() -> None:
    swarm = splice_swarm()
    for node_id in ("rack1-a", "rack1-b", "rack2-a"):
        swarm.mark_down(node_id)
        assert swarm.status() == "degraded"
    swarm.mark_down("rack2-b")
    assert swarm.status() == "failed"
    swarm.mark_alive("rack1-a")
    assert swarm.status() == "degraded"


def test_a_swarm_whose_only_pipeline_lost_a_node_is_degraded_not_failed() -> None:
    swarm = Swarm(nodes(a=6, b=6, spare=0), SwarmConfig(layers=12, pipelines=1))
    result = swarm.mark_down("a")
    assert isinstance(result, Unrecoverable)
    assert swarm.status() == "degraded"
    with pytest.raises(NoHealthyPipeline):
        swarm.route()


def test_a_stopped_swarm_routes_nothing_until_started_again() -> None:
    swarm = splice_swarm()
    before = swarm.route()
    swarm.stop()
    assert swarm.status() == "stopped"
    with pytest.raises(SwarmStopped):
        swarm.route()
    swarm.start()
    assert swarm.status() == "healthy"
    assert swarm.route() == before


def test_a_stopped_swarm_reports_stopped_even_when_every_node_is_dead() -> None:
    swarm = Swarm(nodes(solo=4), SwarmConfig(layers=4, pipelines=1))
    swarm.mark_down("solo")
    swarm.stop()
    assert swarm.status() == "stopped"


# -- splice ----------------------------------------------------------------------------


def test_two_kills_across_racks_are_rescued_by_a_per_layer_splice() -> None:
    swarm = splice_swarm()
    assert isinstance(swarm.mark_down("rack1-b"), Recovered)
    result = swarm.mark_down("rack2-a")
    assert isinstance(result, Recovered)
    assert result.kind == "splice"
    assert result.degraded is False
    assert result.replaced == (
        Replacement(layer_start=0, layer_end=6, old_node="rack2-a", new_node="rack1-a"),
    )
    assert result.route.model_id == "ncm-base"
    assert stages(result.route) == [("rack1-a", 0, 6), ("rack2-b", 6, 12)]


def test_the_splice_keeps_serving_while_its_nodes_live() -> None:
    swarm = splice_swarm()
    swarm.mark_down("rack1-b")
    splice = swarm.mark_down("rack2-a")
    assert isinstance(splice, Recovered)
    for _ in range(3):
        # The same stages; named after the cheapest broken copy they stand in for (the
        # router's choice among every broken copy, r0 here on the tie).
        assert swarm.route().stages == splice.route.stages
        assert swarm.route().pipeline_id == "ncm-base-r0~splice"
    swarm.mark_down("rack2-b")  # a splice node dies: the splice is no longer served
    with pytest.raises(NoHealthyPipeline):
        swarm.route()


def test_a_planned_pipeline_wins_over_the_splice_once_its_nodes_are_back() -> None:
    swarm = splice_swarm()
    swarm.mark_down("rack1-b")
    swarm.mark_down("rack2-a")
    swarm.mark_alive("rack1-b")
    assert swarm.route().pipeline_id == "ncm-base-r0"
    assert swarm.status() == "degraded"


def test_a_splice_is_not_served_through_a_node_the_new_plan_no_longer_gives_those_layers() -> None:
    # rack1-b retires: its pipeline (rack1-a, rack1-b) cannot be repaired and is dropped,
    # so rack1-a holds nothing any more; the old splice through rack1-a must not survive.
    swarm = splice_swarm()
    swarm.mark_down("rack1-b")
    swarm.mark_down("rack2-a")
    removal = swarm.remove_node("rack1-b")
    assert removal.dropped == ("ncm-base-r0",)
    try:
        route = swarm.route()
    except RoutingError:
        return
    unheld = [s for s in route.stages if not held_by_plan(s, route.model_id, swarm.plan)]
    assert unheld == [], f"route {stages(route)} uses layers the plan gives nobody there"


# -- degradation to a reserve model ----------------------------------------------------


def test_losing_the_only_base_pipeline_degrades_to_the_reserve_model_when_allowed() -> None:
    swarm = reserve_swarm(FailoverOptions(allow_degraded=True, reserve_model="mini"))
    result = swarm.mark_down("big")
    assert isinstance(result, Recovered)
    assert result.kind == "degraded"
    assert result.degraded is True
    assert result.route.model_id == "mini"
    assert result.route.node_ids == ("small",)
    assert swarm.status() == "degraded"


def test_losing_the_only_base_pipeline_is_unrecoverable_when_degradation_is_not_allowed() -> None:
    swarm = reserve_swarm(FailoverOptions(allow_degraded=False, reserve_model="mini"))
    result = swarm.mark_down("big")
    assert isinstance(result, Unrecoverable)
    assert "'big'" in result.message
    assert result.lost_node == "big"
    assert result.model_id == "base"
    assert not swarm.state.is_alive("big")


def test_an_expert_named_as_reserve_is_refused_as_a_stand_in() -> None:
    swarm = reserve_swarm(FailoverOptions(allow_degraded=True, reserve_model="mini"), "expert")
    result = swarm.mark_down("big")
    assert isinstance(result, Unrecoverable)
    assert "expert" in result.message
    assert result.lost_node == "big"


def test_an_idle_expert_never_serves_a_request_for_the_base_model() -> None:
    swarm = reserve_swarm(FailoverOptions(), "expert")
    swarm.mark_down("big")
    with pytest.raises(NoHealthyPipeline):
        swarm.route()
    assert swarm.route(model_id="mini").model_id == "mini"


# -- growth ----------------------------------------------------------------------------


@pytest.mark.parametrize("planner", PLANNER_NAMES)
def test_a_newcomer_completes_a_missing_base_replica_with_spare_capacity(planner: str) -> None:
    # 16 layers of capacity hold one 12-layer copy; 4 are left over for the second.
    swarm = Swarm(nodes(a=8, b=8), SwarmConfig(layers=12, pipelines=2), planner=planner)
    assert len(swarm.plan.pipelines) == 1
    assert swarm.status() == "degraded"
    before = swarm.plan
    growth = swarm.add_node(NodeProfile(node_id="c", capacity_layers=8))
    assert growth.kind == "replica"
    assert growth.node_id == "c"
    assert growth.pipelines == ("base-r1",)
    assert growth.epoch == before.epoch + 1 == swarm.plan.epoch
    assert swarm.plan.pipelines[: len(before.pipelines)] == before.pipelines
    (new,) = swarm.plan.pipelines_of("base")[1:]
    assert "c" in new.node_ids
    assert swarm.plan.validate() == []
    assert swarm.status() == "healthy"


def test_a_newcomer_hosts_an_expert_once_the_base_is_complete() -> None:
    helper = ModelSpec(model_id="helper", layers=6, role="expert")
    swarm = Swarm(nodes(a=12, b=12), SwarmConfig(layers=12, pipelines=2, models=(helper,)))
    assert swarm.plan.pipelines_of("helper") == ()
    before = swarm.plan
    growth = swarm.add_node(NodeProfile(node_id="c", capacity_layers=6))
    assert growth.kind == "expert"
    assert growth.pipelines == ("helper-r0",)
    assert swarm.plan.pipelines[: len(before.pipelines)] == before.pipelines
    assert swarm.plan.pipelines_of("helper")[0].node_ids == ("c",)
    assert swarm.route(model_id="helper").node_ids == ("c",)
    assert swarm.plan.validate() == []


def test_a_newcomer_is_spare_capacity_when_nothing_is_missing() -> None:
    swarm = splice_swarm()
    before = swarm.plan
    growth = swarm.add_node(NodeProfile(node_id="rack3-a", capacity_layers=6))
    assert growth.kind == "capacity"
    assert growth.pipelines == ()
    assert swarm.plan.pipelines == before.pipelines
    assert swarm.plan.epoch == growth.epoch == before.epoch + 1
    assert "rack3-a" in swarm.state.live_nodes()
    assert swarm.status() == "healthy"


def test_every_growth_step_bumps_the_epoch_and_keeps_existing_pipelines() -> None:
    swarm = Swarm(nodes(a=12), SwarmConfig(layers=12, pipelines=3))
    for i, node_id in enumerate(("b", "c", "d"), start=2):
        before = swarm.plan.pipelines
        growth = swarm.add_node(NodeProfile(node_id=node_id, capacity_layers=12))
        assert growth.epoch == swarm.plan.epoch == i
        assert swarm.plan.pipelines[: len(before)] == before
    assert [g.pipeline_id for g in swarm.plan.pipelines] == ["base-r0", "base-r1", "base-r2"]


def test_a_newcomer_rebuilds_a_base_copy_lost_to_a_dead_node() -> None:
    swarm = splice_swarm()
    swarm.mark_down("rack1-b")
    growth = swarm.add_node(NodeProfile(node_id="rack3-a", capacity_layers=12))
    assert growth.kind == "replica"
    assert swarm.status() == "healthy"
    assert swarm.plan.validate() == []


def test_growth_hosts_the_reserve_before_an_expert() -> None:
    # Planning puts the reserve (the safety net) before experts; growth should too.
    models = (
        ModelSpec(model_id="aa-expert", layers=4, role="expert"),
        ModelSpec(model_id="zz-reserve", layers=4, role="reserve"),
    )
    swarm = Swarm(nodes(a=12), SwarmConfig(layers=12, pipelines=1, models=models))
    growth = swarm.add_node(NodeProfile(node_id="b", capacity_layers=4))
    assert growth.kind == "expert"
    assert growth.pipelines == ("zz-reserve-r0",)


def test_a_newcomer_too_small_for_a_base_copy_is_kept_for_the_base_not_spent_on_an_expert() -> None:
    # The base wants 2 copies of 12 layers and has 1. A 4-layer newcomer cannot build the
    # second one alone, but together with a later 8-layer newcomer it can; an expert only
    # grows once the base is complete.
    helper = ModelSpec(model_id="helper", layers=4, role="expert")
    swarm = Swarm(nodes(a=12), SwarmConfig(layers=12, pipelines=2, models=(helper,)))
    first = swarm.add_node(NodeProfile(node_id="b", capacity_layers=4))
    assert first.kind == "capacity"
    assert swarm.plan.pipelines_of("helper") == ()
    second = swarm.add_node(NodeProfile(node_id="c", capacity_layers=8))
    assert second.kind == "replica"
    assert swarm.status() == "healthy"


def test_a_node_cannot_join_twice() -> None:
    swarm = splice_swarm()
    epoch = swarm.plan.epoch
    with pytest.raises(DuplicateNode):
        swarm.add_node(NodeProfile(node_id="rack1-a", capacity_layers=6))
    assert swarm.plan.epoch == epoch


# -- removal ---------------------------------------------------------------------------


def test_a_retiring_node_hands_its_layers_to_spare_capacity() -> None:
    swarm = Swarm(nodes(a=6, b=6, c=6, d=6, e=6), SwarmConfig(layers=12, pipelines=2))
    assert swarm.route().node_ids == ("a", "b")
    removal = swarm.remove_node("b")
    assert removal.relocated == (
        Replacement(layer_start=6, layer_end=12, old_node="b", new_node="e"),
    )
    assert removal.dropped == ()
    assert removal.epoch == swarm.plan.epoch == 2
    assert swarm.plan.validate() == []
    assert "b" not in nodes_in(swarm.plan)
    assert "b" not in swarm.state.nodes
    assert [p.node_ids for p in swarm.plan.pipelines] == [("a", "e"), ("c", "d")]
    assert swarm.status() == "healthy"
    assert swarm.route().node_ids == ("a", "e")


def test_a_retiring_node_whose_layers_fit_nowhere_takes_its_pipeline_with_it() -> None:
    swarm = Swarm(nodes(a=6, b=6, c=6, d=6), SwarmConfig(layers=12, pipelines=2))
    removal = swarm.remove_node("a")
    assert removal.dropped == ("base-r0",)
    assert removal.relocated == ()
    assert removal.rebuilt == ()
    assert swarm.plan.validate() == []
    assert "a" not in nodes_in(swarm.plan)
    assert [p.pipeline_id for p in swarm.plan.pipelines] == ["base-r1"]
    assert swarm.status() == "degraded"
    assert swarm.route().node_ids == ("c", "d")


def test_retiring_a_stranger_raises_unknown_node() -> None:
    swarm = splice_swarm()
    with pytest.raises(UnknownNode):
        swarm.remove_node("ghost")
    assert swarm.plan.epoch == 1


# -- construction ----------------------------------------------------------------------


@pytest.mark.parametrize("planner", PLANNER_NAMES)
def test_a_swarm_that_cannot_hold_one_base_pipeline_refuses_to_start(planner: str) -> None:
    with pytest.raises(InsufficientCapacity, match="'base'"):
        Swarm(nodes(a=5, b=6), SwarmConfig(layers=12), planner=planner)
    with pytest.raises(InsufficientCapacity):
        Swarm([], SwarmConfig(layers=1))


# -- random lifecycles -----------------------------------------------------------------

NODE_IDS = ("n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7")


class SwarmLifecycle(RuleBasedStateMachine):
    """Random deaths, revivals, arrivals and retirements on a random swarm."""

    swarm: Swarm

    @initialize(
        caps=st.lists(st.integers(0, 16), min_size=1, max_size=6),
        layers=st.integers(1, 12),
        pipelines=st.integers(1, 3),
        reserve_layers=st.none() | st.integers(1, 8),
        expert_layers=st.none() | st.integers(1, 8),
        allow_degraded=st.booleans(),
        planner=st.sampled_from(PLANNER_NAMES),
    )
    def build(
        self,
        caps: list[int],
        layers: int,
        pipelines: int,
        reserve_layers: int | None,
        expert_layers: int | None,
        allow_degraded: bool,
        planner: str,
    ) -> None:
        if sum(caps) < layers:  # room for at least one base pipeline
            caps = [*caps, layers - sum(caps)]
        models: list[ModelSpec] = []
        if reserve_layers is not None:
            models.append(ModelSpec(model_id="reserve", layers=reserve_layers, role="reserve"))
        if expert_layers is not None:
            models.append(ModelSpec(model_id="expert", layers=expert_layers, role="expert"))
        config = SwarmConfig(
            layers=layers,
            pipelines=pipelines,
            models=tuple(models),
            failover=FailoverOptions(
                allow_degraded=allow_degraded,
                reserve_model="reserve" if reserve_layers is not None else None,
            ),
        )
        self.swarm = Swarm(
            nodes(**dict(zip(NODE_IDS, caps, strict=False))), config, planner=planner
        )

    def members(self) -> list[str]:
        return sorted(self.swarm.state.nodes)

    def has_members(self) -> bool:
        return bool(self.swarm.state.nodes)

    def has_room(self) -> bool:
        return len(self.swarm.state.nodes) < len(NODE_IDS)

    @precondition(has_members)
    @rule(data=st.data())
    def mark_down(self, data: st.DataObject) -> None:
        node_id = data.draw(st.sampled_from(self.members()), label="mark_down")
        result = self.swarm.mark_down(node_id)
        assert not self.swarm.state.is_alive(node_id)
        if isinstance(result, Unrecoverable):
            assert result.lost_node == node_id
            return
        route = result.route
        assert all(self.swarm.state.is_alive(n) for n in route.node_ids), route
        model = self.swarm.plan.model(route.model_id)
        assert model is not None
        assert covers_exactly(route.stages, model.layers), route
        # Degraded whenever the answer is the reserve's: found now, or already served
        # (the loss left the reserve's route ``unaffected``).
        assert result.degraded == (model.role == "reserve")
        assert result.kind in (
            ("degraded", "unaffected") if result.degraded else ("unaffected", "replica", "splice")
        )
        if result.kind == "degraded":
            assert model.role == "reserve"
        if model.role != "reserve":
            assert route.model_id == self.swarm.config.model_id

    @precondition(has_members)
    @rule(data=st.data())
    def mark_alive(self, data: st.DataObject) -> None:
        node_id = data.draw(st.sampled_from(self.members()), label="mark_alive")
        self.swarm.mark_alive(node_id)
        assert self.swarm.state.is_alive(node_id)

    @precondition(has_room)
    @rule(data=st.data(), capacity=st.integers(0, 16))
    def add_node(self, data: st.DataObject, capacity: int) -> None:
        free = [i for i in NODE_IDS if i not in self.swarm.state.nodes]
        node_id = data.draw(st.sampled_from(free), label="add_node")
        before = self.swarm.plan
        growth = self.swarm.add_node(NodeProfile(node_id=node_id, capacity_layers=capacity))
        assert growth.epoch == self.swarm.plan.epoch == before.epoch + 1
        assert self.swarm.plan.pipelines[: len(before.pipelines)] == before.pipelines
        added = self.swarm.plan.pipelines[len(before.pipelines) :]
        assert tuple(p.pipeline_id for p in added) == growth.pipelines
        assert (growth.kind == "capacity") == (growth.pipelines == ())

    @precondition(has_members)
    @rule(data=st.data())
    def remove_node(self, data: st.DataObject) -> None:
        node_id = data.draw(st.sampled_from(self.members()), label="remove_node")
        epoch = self.swarm.plan.epoch
        removal = self.swarm.remove_node(node_id)
        assert removal.epoch == self.swarm.plan.epoch == epoch + 1
        assert node_id not in nodes_in(self.swarm.plan)
        assert node_id not in self.swarm.state.nodes

    @invariant()
    def failed_iff_no_live_node(self) -> None:
        assert (self.swarm.status() == "failed") == (not self.swarm.state.live_nodes())

    @invariant()
    def plan_validates(self) -> None:
        assert self.swarm.plan.validate() == []
        assert {n.node_id for n in self.swarm.plan.nodes} == set(self.swarm.state.nodes)

    @invariant()
    def routes_are_whole_live_and_of_the_requested_model(self) -> None:
        for wanted in self.swarm.plan.models:
            try:
                route, degraded = self.swarm.choose(model_id=wanted.model_id)
            except RoutingError:
                continue
            # The router's policy: a new request goes to the reserve model, flagged
            # degraded, only when degradation is allowed and the model it asked for has
            # no copy and no splice left.
            if degraded:
                assert self.swarm.config.failover.allow_degraded
                assert route.model_id == self.swarm.config.failover.reserve_model
                assert route.model_id != wanted.model_id
            else:
                assert route.model_id == wanted.model_id
            model = self.swarm.plan.model(route.model_id)
            assert model is not None
            assert all(self.swarm.state.is_alive(n) for n in route.node_ids), route
            assert covers_exactly(route.stages, model.layers), route
            held = [s for p in self.swarm.plan.pipelines_of(model.model_id) for s in p.stages]
            for s in route.stages:  # every stage runs layers its node holds in the plan
                assert any(
                    h.node_id == s.node_id
                    and h.layer_start <= s.layer_start
                    and s.layer_end <= h.layer_end
                    for h in held
                ), route


def test_random_lifecycles_keep_the_swarm_sound_after_every_step() -> None:
    run_state_machine_as_test(
        SwarmLifecycle,
        settings=settings(max_examples=100, stateful_step_count=20, deadline=None),
    )
