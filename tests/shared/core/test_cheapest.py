"""A router's decisions from its heap of costs (:mod:`hecate.core.cheapest`) are what a
walk over every pipeline would give, whatever happens between them: dispatches begun
and ended, round trips measured, measurement windows closing as time passes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hecate.core import Route, Router, RoutingRequest
from hecate.core.cheapest import Cheapest
from hecate.core.cost import inflight_cost
from hecate.core.errors import Saturated
from tests.support.builders import measured, pipeline, plan

REQ = RoutingRequest()
N = 6

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("begin"), st.integers(0, N - 1), st.just(0.0)),
        st.tuples(st.just("end"), st.integers(0, N - 1), st.just(0.0)),
        st.tuples(st.just("measure"), st.integers(0, N - 1), st.floats(0.0, 0.05)),
        st.tuples(st.just("wait"), st.just(0), st.floats(0.0, 40.0)),
        st.tuples(st.just("decide"), st.integers(0, 2**N - 1), st.just(0.0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([1.0, 2.0, 5.0]), min_size=N, max_size=N), OPS)
def test_every_decision_is_the_least_cost_of_every_pipeline_now(
    latencies: list[float], ops: list[tuple[str, int, float]]
) -> None:
    p = plan([pipeline(f"m-r{i}", "m", (f"n{i}", 0, 4)) for i in range(N)])
    router = Router(measured(p, {f"n{i}": (lat, 0.0, 1.0) for i, lat in enumerate(latencies)}))
    stages = {q.pipeline_id: q.stages for q in p.pipelines}
    now = 1.0
    begun: list[Route] = []
    for op, which, x in ops:
        pid = f"m-r{which % N}"
        if op == "begin":
            route = Route(model_id="m", pipeline_id=pid, cost=0.0, stages=stages[pid])
            router.begin(route)
            begun.append(route)
        elif op == "end" and begun:
            router.end(begun.pop(which % len(begun)))
        elif op == "measure":
            router.measured(pid, x, now=now)
        elif op == "wait":
            now += x
        full = {f"m-r{i}" for i in range(N) if which >> i & 1} if op == "decide" else set()
        expected = [
            (
                base
                + inflight_cost(router.in_flight(pipe.stages[0].node_id))
                + router.link(pipe, now),
                q,
            )
            for base, q, pipe in router.state.cost_table("m")
            if q not in full
        ]
        if not expected:
            with pytest.raises(Saturated):
                router.route("m", REQ, full, now=now)
            continue
        got = router.route("m", REQ, full, now=now)
        assert (got.cost, got.pipeline_id) == pytest.approx(min(expected))


def test_the_heap_does_not_grow_with_the_changes_it_has_seen() -> None:
    costs = {f"p{i}": float(i) for i in range(10)}
    cheapest = Cheapest(costs, lambda pid, _at: (costs[pid], float("inf")))
    for step in range(5000):
        costs["p9"] = 100.0 + step  # re-costed, always at the bottom
        cheapest.touch("p9")
        assert cheapest.pick(1.0) == (0.0, "p0")
    assert len(cheapest._heap) <= 2 * len(costs) + 65
