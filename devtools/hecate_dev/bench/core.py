"""``hecate bench core``: the routing decision and the planner, measured.

* ``route_us``: one routing decision (:func:`route_request` on an unchanged snapshot,
  i.e. a lookup in the per-snapshot cost cache) by pipelines x stages. Calls are timed in
  batches of ``BATCH`` and each batch's mean is one sample, so the figures do not
  include the timer's own overhead per call; p50/p99 are over batches.
* ``floor_us``: the baseline measured in the same run: building the same :class:`Route`
  from precomputed fields, with no decision at all. ``route_us`` / ``floor_us`` is the
  price of deciding.
* ``route_inflight_us``: the same through :class:`Router` with requests in flight on
  every pipeline (the worst case of the in-flight walk).
* ``recost_us``: a telemetry change, i.e. a new snapshot, and the first decision on it
  (which recomputes that model's cost table).
* ``plan_ms``: a whole plan by node count (greedy and proportional), median of runs.
"""

from __future__ import annotations

import datetime
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from functools import partial

from hecate.core import (
    ModelSpec,
    NodeProfile,
    Pipeline,
    Route,
    Router,
    RoutingRequest,
    Sample,
    Stage,
    SwarmPlan,
    SwarmState,
    get_planner,
    route_request,
)
from hecate_dev.bench.results import CoreResult, load

BATCH = 50
SHAPES = ((2, 3), (8, 4), (32, 6))
PLAN_SIZES = (100, 1000, 10000)
MODEL = "bench-model"


def synthetic_state(pipelines: int, stages: int, *, seed: int = 7) -> SwarmState:
    """``pipelines`` disjoint copies of a ``stages``-stage pipeline, all nodes measured."""
    rng = random.Random(seed)
    layers = stages * 4
    nodes: list[NodeProfile] = []
    pipes: list[Pipeline] = []
    for p in range(pipelines):
        chain = []
        for s in range(stages):
            node_id = f"n{p}-{s}"
            nodes.append(
                NodeProfile(
                    node_id=node_id,
                    capacity_layers=4,
                    latency_ms=rng.uniform(1, 20),
                    score=rng.uniform(0.5, 4),
                )
            )
            chain.append(Stage(node_id=node_id, layer_start=s * 4, layer_end=s * 4 + 4))
        pipes.append(Pipeline(pipeline_id=f"{MODEL}-r{p}", model_id=MODEL, stages=tuple(chain)))
    plan = SwarmPlan(
        epoch=1,
        models=(ModelSpec(model_id=MODEL, layers=layers),),
        nodes=tuple(nodes),
        pipelines=tuple(pipes),
    )
    state = SwarmState.from_plan(plan)
    for n in nodes:
        state = state.observe(
            n.node_id,
            Sample(latency_ms=n.latency_ms, load=rng.uniform(0, 1), score=n.score),
            now=0.0,
        )
    return state


def per_call_us(fn: Callable[[], object], samples: int) -> dict[str, float]:
    for _ in range(BATCH * 10):  # warm caches and the interpreter's specialisation
        fn()
    means = []
    clock = time.perf_counter_ns
    for _ in range(samples):
        t0 = clock()
        for _ in range(BATCH):
            fn()
        means.append((clock() - t0) / BATCH / 1000)
    means.sort()
    return {
        "p50": round(means[len(means) // 2], 3),
        "p99": round(means[min(len(means) - 1, int(len(means) * 0.99))], 3),
    }


def bench_routes(samples: int) -> tuple[dict[str, dict[str, float]], ...]:
    route: dict[str, dict[str, float]] = {}
    floor: dict[str, dict[str, float]] = {}
    inflight: dict[str, dict[str, float]] = {}
    recost: dict[str, dict[str, float]] = {}
    request = RoutingRequest(tokens=512)
    for pipelines, stages in SHAPES:
        key = f"{pipelines}x{stages}"
        state = synthetic_state(pipelines, stages)
        route[key] = per_call_us(partial(route_request, MODEL, request, state), samples)
        best = route_request(MODEL, request, state)
        floor[key] = per_call_us(
            partial(
                Route,
                model_id=MODEL,
                pipeline_id=best.pipeline_id,
                cost=best.cost,
                stages=best.stages,
            ),
            samples,
        )

        router = Router(state)
        for _ in state.plan.pipelines:  # something in flight everywhere: the slow path
            router.begin(router.route(MODEL, request))
        inflight[key] = per_call_us(partial(router.route, MODEL, request), samples)

        node_id = state.plan.pipelines[0].stages[0].node_id
        now = [0.0]

        def change(s: SwarmState = state, n: str = node_id, now: list[float] = now) -> object:
            now[0] += 1.0
            return route_request(MODEL, request, s.observe(n, Sample(load=0.5), now=now[0]))

        recost[key] = per_call_us(change, max(samples // 10, 20))
    return route, floor, inflight, recost


def synthetic_nodes(count: int, *, seed: int = 11) -> list[NodeProfile]:
    rng = random.Random(seed)
    return [
        NodeProfile(
            node_id=f"node-{i:05d}",
            capacity_layers=rng.randint(2, 16),
            latency_ms=round(rng.uniform(1, 50), 2),
            score=round(rng.uniform(0.3, 4), 2),
        )
        for i in range(count)
    ]


def bench_plans(repeats: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name in ("greedy", "proportional"):
        planner = get_planner(name)
        out[name] = {}
        for count in PLAN_SIZES:
            nodes = synthetic_nodes(count)
            model = ModelSpec(model_id=MODEL, layers=32, replicas=count // 10)
            times = []
            for _ in range(repeats if count < 10000 else max(1, repeats // 3)):
                t0 = time.perf_counter()
                plan = planner.plan((model,), nodes)
                times.append((time.perf_counter() - t0) * 1000)
            assert not plan.validate(), plan.validate()[:3]
            out[name][str(count)] = round(statistics.median(times), 2)
    return out


def run_core_bench(*, quick: bool = False) -> CoreResult:
    samples, repeats = (200, 3) if quick else (2000, 9)
    route, floor, inflight, recost = bench_routes(samples)
    plans = bench_plans(repeats)
    # Checked against the declared shape as it is made, not first when the report reads it.
    figures = {
        "route_us": route,
        "floor_us": floor,
        "route_over_floor": {k: round(route[k]["p50"] / floor[k]["p50"], 2) for k in route},
        "route_inflight_us": inflight,
        "recost_us": recost,
        "plan_ms": plans["greedy"],
        "plan_ms_proportional": plans["proportional"],
        "meta": {
            "replicas_per_plan": "nodes // 10, 32-layer model, capacity 2..16 layers",
            "python": platform.python_version(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
            "batch": BATCH,
            "samples": samples,
            "plan_repeats": repeats,
        },
    }
    return load(figures, CoreResult)
