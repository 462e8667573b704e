"""The swarm core section: routing decision and planning (``hecate bench core``)."""

# Prose for people: its dashes and multiplication signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from hecate_dev.bench.report.markdown import (
    Doc,
    Target,
    num,
    provenance,
    shape,
    span,
    table,
    verdict,
)

CORE_TARGET_US = 5.0  # a routing decision at 8 pipelines x 4 stages
PLAN_TARGET_MS = 50.0  # a plan for 1,000 nodes


def section_core(env: Doc, img: str) -> tuple[str, list[Target]]:
    r = env["report"]
    meta = r["meta"]
    route, floor, over = r["route_us"], r["floor_us"], r["route_over_floor"]
    shapes = list(route)
    decisions = table(
        [
            "pipelines × stages",
            "p50",
            "p99",
            "baseline: building the same `Route`, p50",
            "decision ÷ baseline",
        ],
        [
            [
                shape(k),
                num(route[k]["p50"], 2),
                num(route[k]["p99"], 2),
                num(floor[k]["p50"], 2),
                num(over[k], 1),
            ]
            for k in shapes
        ],
    )
    inflight = table(
        ["pipelines × stages", "p50", "p99"],
        [[shape(k), num(v["p50"], 2), num(v["p99"], 2)] for k, v in r["route_inflight_us"].items()],
    )
    recost = table(
        ["pipelines × stages", "p50", "p99"],
        [[shape(k), num(v["p50"], 1), num(v["p99"], 1)] for k, v in r["recost_us"].items()],
    )
    plans = table(
        ["nodes", "greedy", "proportional"],
        [
            [f"{int(n):,}", num(ms, 2), num(r["plan_ms_proportional"][n], 2)]
            for n, ms in r["plan_ms"].items()
        ],
    )
    p50 = route.get("8x4", {}).get("p50")
    loaded = r["route_inflight_us"].get("8x4", {}).get("p50")
    # A router serving traffic has its own requests in flight: the target holds only if
    # the decision stays within it then too, not just on an idle router.
    met_route = None if p50 is None or loaded is None else max(p50, loaded) <= CORE_TARGET_US
    route_figure = (
        "–"
        if p50 is None or loaded is None
        else f"p50 {num(p50, 2)} µs idle, {num(loaded, 2)} µs with requests in flight"
    )
    margin = (
        ""
        if not p50 or not loaded
        else f", a margin of {num(CORE_TARGET_US / max(p50, loaded), 1)}x on the slower"
    )
    first, last = route[shapes[0]]["p50"], route[shapes[-1]]["p50"]
    growth = (
        "grows with the number of pipelines"
        if last > 1.5 * first
        else "does not grow with the number of pipelines, because the ranking is done once "
        "per snapshot"
    )
    per_stage = []
    for key in shapes:
        pipes, stages = (int(v) for v in key.split("x"))
        per_stage.append(r["recost_us"][key]["p50"] / (pipes * stages))
    greedy, proportional = r["plan_ms"].get("1000"), r["plan_ms_proportional"].get("1000")
    met_plan = None
    plan_figure = "–"
    if greedy is not None and proportional is not None:
        met_plan = max(greedy, proportional) <= PLAN_TARGET_MS
        plan_figure = f"greedy {num(greedy, 2)} ms, proportional {num(proportional, 2)} ms"
    repeats = meta.get("plan_repeats", 9)
    text = f"""## Swarm core: routing decision and planning

{provenance(env)}
The suite prints JSON; the fields are explained in `devtools/hecate_dev/bench/core.py`.

### Routing decision (µs per decision)

`route_request()` on an unchanged snapshot: a lookup in the snapshot's cost cache plus
the token term and the `Route` it returns. Calls are timed in batches of {meta["batch"]},
each batch's mean is one sample, {meta["samples"]:,} samples per shape.

{decisions}

Target (issue: ≤ {CORE_TARGET_US:g} µs at 8 × 4, idle and with this router's own requests
in flight on every pipeline, the second table below): {verdict(met_route)}
({route_figure}{margin}).
The decision costs {span(list(over.values()), 1)} times the allocation of its own
result, and {growth} (p50 {num(first, 2)} µs at
{shape(shapes[0])}, {num(last, 2)} µs at {shape(shapes[-1])}).

With this router's own requests in flight on **every** pipeline (the slow path of
`Router.route`, which walks the cost table until no cheaper-based entry can win):

{inflight}

A telemetry change (a new snapshot) followed by the first decision on it, which
re-costs every pipeline of the model:

{recost}

Re-costing takes {span(per_stage, 2)} µs per stage cost (p50 ÷ pipelines ÷ stages) and
happens once per snapshot, not per request.

![routing decision cost by swarm shape]({img}/bench-core.png)

### Planning (ms per whole plan, median of {repeats} runs; {max(1, repeats // 3)} at 10,000 nodes)

Synthetic swarm: node capacity uniform in 2..16 layers, latency 1..50 ms, one 32-layer
model asking for `nodes // 10` replicas (every plan is validated after timing).

{plans}

Target (issue: a plan for 1,000 nodes ≤ {PLAN_TARGET_MS:g} ms): {verdict(met_plan)}
({plan_figure}).

These figures involve no network; the bus figures follow.
"""
    targets = [
        Target("routing decision at 8 × 4 ≤ 5 µs, idle and loaded", route_figure, met_route),
        Target("a plan for 1,000 nodes ≤ 50 ms", plan_figure, met_plan),
    ]
    return text, targets
