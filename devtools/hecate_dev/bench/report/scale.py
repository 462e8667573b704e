"""The scale section: what forming, beating and following a swarm costs per node, size by
size (``hecate bench scale``)."""

from __future__ import annotations

from typing import Any

from hecate_dev.bench.report.markdown import Doc, Target, num, provenance, table


def section_scale(env: Doc, img: str) -> tuple[str, list[Target]]:
    r: dict[str, Any] = env["report"]
    meta = r["meta"]
    sizes = [
        lv for lv in r["levels"] if lv.get("routers", 1) == 1 and lv.get("telemetry_shards", 1) == 1
    ]
    many = [lv for lv in r["levels"] if lv.get("routers", 1) > 1]
    sharded = [lv for lv in r["levels"] if lv.get("telemetry_shards", 1) > 1]
    rows = [
        [
            f"{lv['nodes']:,}",
            str(lv["hosts"]),
            f"{lv['alive']:,}" + ("" if lv["formed"] else " (not all)"),
            num(lv["all_alive_s"], 1),
            num(lv.get("planned_s", 0.0), 1),
            f"{lv.get('pipelines', 0):,}",
            f"{lv.get('plan_bytes', 0):,}",
            f"{lv.get('plans_published', 1):,}",
            f"{lv.get('shares_written', 0):,}",
            num(lv.get("beat_s", meta["heartbeat_ms"] / 1000), 2),
            " + ".join(str(x) for x in lv["host_rss_mb"]),
            num(lv["host_cpu_us_per_node_per_s"], 0),
            num(lv["telemetry_cpu_per_s"], 3),
            num(lv["telemetry_cpu_us_per_beat"], 1),
            _heard(lv),
            f"{lv['snapshot_bytes']:,}",
            num(lv.get("snapshot_updates_per_s", 0.0), 1),
            f"{lv.get('follow_bytes_per_s', 0):,}",
            _whole(lv),
            f"{lv.get('follow_snapshots', '-')}; {lv.get('follow_gaps', '-')}",
            num(lv.get("router_cpu_per_s", 0.0), 3),
        ]
        for lv in sizes
    ]
    figures = table(
        [
            "nodes",
            "hosts",
            "alive",
            "all alive after (s)",
            "planned after (s)",
            "copies planned",
            "plan (bytes)",
            "plans published",
            "shares written",
            "beats every (s)",
            "host RSS (MB)",
            "host CPU per node (µs/s)",
            "telemetry CPU (cores)",
            "telemetry CPU per beat (µs)",
            "beats heard / sent (/s); missed",
            "snapshot (bytes)",
            "deltas (/s)",
            "a router follows (bytes/s)",
            "the same as whole snapshots (bytes/s, computed)",
            "snapshots read again; deltas missed",
            "router CPU (cores)",
        ],
        rows,
    )
    planned = [lv for lv in r["levels"] if lv.get("plan_bytes") and lv.get("planned_nodes")]
    # Per node at the largest size (the smaller ones carry more fixed overhead a node).
    per_plan = planned[-1]["plan_bytes"] / planned[-1]["planned_nodes"] if planned else 181
    per_snapshot = r["levels"][-1]["snapshot_bytes_per_node"] or 127
    parts_plan = int(round(256 * 1024 / per_plan, -1))
    parts_snapshot = int(round(256 * 1024 / per_snapshot, -1))
    decided = [lv for lv in sizes if "route_idle_us" in lv]
    one_router = {lv["nodes"]: lv for lv in sizes}
    followed = "".join(_many_routers(lv, one_router.get(lv["nodes"])) for lv in many)
    shared = _shared_intake(sharded, one_router) if sharded else ""
    cut = _cutoff(r["cutoff"]) if "cutoff" in r else ""
    decisions = table(
        [
            "nodes",
            "copies",
            "idle, nothing measured p50 / p99 (µs)",
            "half measured p50 / p99 (µs)",
            "and 32 in flight p50 / p99 (µs)",
            "a decision, its dispatch begun and the oldest ended, p50 / p99 (µs)",
            "a new snapshot (ms)",
        ],
        [
            [
                f"{lv['nodes']:,}",
                f"{max(1, lv['nodes'] // 6):,}",
                *(
                    f"{num(lv[k]['p50'], 1)} / {num(lv[k]['p99'], 1)}"
                    for k in ("route_idle_us", "route_measured_us", "route_busy_us")
                ),
                _pair(lv.get("route_churn_us")),
                num(lv["snapshot_ms"], 2),
            ]
            for lv in decided
        ],
    )
    broke = [
        f"at {_run(lv)} a host exited"
        + (f": {why}" if why != "exited" else ", its log naming no failure")
        for lv in r["levels"]
        for why in lv.get("host_failures", [])[:1]
    ]
    broke += [
        f"at {_run(lv)} the plan held {lv['planned_nodes']:,} of the "
        f"{lv['alive']:,} alive when the suite stopped waiting, {num(lv['planned_s'], 0)} s "
        "later (see Known limits in docs/SERVICES.md)"
        for lv in r["levels"]
        if lv.get("planned_nodes", lv["alive"]) < lv["alive"]
    ]
    broken = (
        "What broke: " + "; ".join(broke) + ". " if broke else "Every host stood at every size. "
    )
    picture = (
        "![a router's bytes following the swarm, telemetry CPU a beat, forming time and "
        f"decision p99 against nodes]({img}/bench-scale.png)"
    )
    text = f"""## A swarm of many nodes: what each node costs

{provenance(env)}
One nats-server, one telemetry service, one router, a planner and node hosts
(`hecate node-host`: up to
{meta["per_host"]:,} node identities in one process, each a whole node on the bus: its
own two connections, subjects, heartbeats and share of the plan) on the
`{meta["executor"]}` executor. Nodes beat every {meta["heartbeat_ms"]:,} ms while the
whole swarm's beats stay under {meta.get("beat_budget_per_s", 2000):,} a second, slower
past that (never slower than {meta.get("most_ms", 1000) / 1000:g} s). Per size: how
long after the hosts started telemetry called every node alive; how long after that the
planner (running from the start, as a swarm's does: its notices tell the nodes how many
members there are before any plan) had published a plan holding them all, how many
copies it planned (`--pipelines auto`: a 48-layer base on nodes of 8 layers), the
plan's size, and the plans it published meanwhile and the shares it wrote for them in
all (each node reads only its own); the hosts' memory, the CPU the hosts
and telemetry spend per second once the swarm stands (over
{num(meta["steady_s"], 0)} s), the size of the telemetry snapshot (the whole swarm), and
what following telemetry costs a router with nothing to route (`hecate.bus.telemetry.follow`:
the deltas of what changed, a snapshot read only when one was missed): the deltas and
bytes it receives a second, what the same updates would have been as whole snapshots
(the snapshot's size times the deltas a second, as routers followed telemetry before:
computed, not measured), the snapshots it read again and the deltas it missed, and its
CPU.

{figures}

{picture}

One identity adds {num(r["rss_added_per_node_mb"], 3)} MB to its host (the slope
between the two smallest sizes). A value past 256 KiB (the plan from about
{parts_plan:,} nodes, the snapshot from about {parts_snapshot:,}) is stored in parts, so
neither meets NATS's 1 MB max_payload; a router reads them when it starts and when
it missed a delta, not on every change.
{broken}

**A routing decision at these sizes**, in this process, on a router holding a plan of
that many nodes in six-stage copies, every node measured by telemetry (the router's
own `Router.route`: each model's copies in a heap by their cost now; times per call,
over batches of 50, each answer checked at the end against a walk over every copy):
with nothing measured by the router itself, with the round trips of half the copies
measured, with 32 requests in flight on top, and as a router under load decides, each
decision's dispatch begun and the oldest of the 32 ended (the three calls timed
together: the two that move the load re-cost the copies they touch); and what a new
telemetry snapshot costs it (its state rebuilt, adopted and the first decision made
on it).

{decisions}

{followed}{shared}{cut}"""
    return text, []


def _many_routers(lv: dict[str, Any], alone: dict[str, Any] | None) -> str:
    """A paragraph on several routers following one swarm, beside one router alone."""
    copies = lv.get("copies_by_model", {})
    planned = ", ".join(f"{n:,} of {m}" for m, n in sorted(copies.items()))
    text = (
        f"**{lv['routers']} routers following {lv['nodes']:,} nodes**"
        + (f" and {len(copies)} models ({planned} copies planned)" if len(copies) > 1 else "")
        + ": each received "
        f"{lv['follow_bytes_per_s']:,} bytes a second of telemetry and spent "
        f"{num(lv['router_cpu_per_s'], 3)} of a core"
    )
    if alone is not None:
        text += f" (one router alone: {num(alone['router_cpu_per_s'], 3)})"
    text += f"; the nats-server spent {num(lv.get('server_cpu_per_s', 0.0), 3)} of a core"
    if alone is not None:
        text += f" ({num(alone.get('server_cpu_per_s', 0.0), 3)} with one router)"
    return text + ".\n\n"


def _shared_intake(levels: list[dict[str, Any]], alone: dict[int, dict[str, Any]]) -> str:
    """A table of swarms whose heartbeat intake several telemetry replicas share,
    beside the same size with one replica."""
    rows = []
    for lv in levels:
        one = alone.get(lv["nodes"])
        rows.append(
            [
                f"{lv['nodes']:,}",
                str(lv["telemetry_shards"]),
                f"{lv['alive']:,}" + ("" if lv["formed"] else " (not all)"),
                num(lv["all_alive_s"], 1),
                f"{lv['beats_expected_per_s']:,}",
                " + ".join(f"{h:,}" for h in lv["beats_heard_per_s"])
                + f"; {lv.get('beats_missed', '-')} missed",
                " + ".join(num(c, 3) for c in lv["shard_cpu_per_s"]),
                num(lv["telemetry_cpu_us_per_beat"], 1)
                + (f" ({num(one['telemetry_cpu_us_per_beat'], 1)})" if one else ""),
                num(lv["snapshot_updates_per_s"], 1)
                + (f" ({num(one['snapshot_updates_per_s'], 1)})" if one else ""),
                f"{lv['follow_bytes_per_s']:,}"
                + (f" ({one['follow_bytes_per_s']:,})" if one else ""),
                num(lv["router_cpu_per_s"], 3)
                + (f" ({num(one['router_cpu_per_s'], 3)})" if one else ""),
            ]
        )
    shown = table(
        [
            "nodes",
            "telemetry replicas",
            "alive",
            "all alive after (s)",
            "beats sent (/s, by the nodes' pace)",
            "beats heard per replica (/s); missed",
            "CPU per replica (cores)",
            "telemetry CPU per beat (µs; one replica)",
            "deltas a router gets (/s; one replica)",
            "a router follows (bytes/s; one replica)",
            "router CPU (cores; one replica)",
        ],
        rows,
    )
    return f"""**The heartbeat intake shared by several telemetry replicas** (`hecate
telemetry --shards N --shard K`): the server maps each node's heartbeat subject to one
of 16 partitions by a hash of its id, each replica takes its own partitions and writes
its own deltas and snapshot, and routers merge the shards. Beats
heard are each replica's heartbeat endpoints' counts over the measured window; in
parentheses, the same size with one replica.

{shown}

"""


def _pair(figures: dict[str, float] | None) -> str:
    """p50 / p99 of a timing, or "-" for a run that did not measure it."""
    if not figures:
        return "-"
    return f"{num(figures['p50'], 1)} / {num(figures['p99'], 1)}"


def _whole(lv: dict[str, Any]) -> str:
    """What a router would have received had each delta been the whole snapshot."""
    if "follow_snapshots" not in lv:  # a run from before the deltas: it received those
        return "-"
    return f"{round(lv['snapshot_bytes'] * lv['snapshot_updates_per_s']):,}"


def _heard(lv: dict[str, Any]) -> str:
    """Beats telemetry took a second beside those the nodes' pace sends, and the beats
    it never heard (gaps in the nodes' numbering) over the window."""
    if "beats_heard_per_s" not in lv:
        return "-"
    heard = sum(lv["beats_heard_per_s"])
    return f"{heard:,} / {lv['beats_expected_per_s']:,}; {lv.get('beats_missed', '-')}"


def _cutoff(c: dict[str, Any]) -> str:
    """The cut-off paragraph: a rack of nodes on its own host losing its cable under
    load, with the verdicts the figures decide."""
    if "skipped" in c:
        return f"**A rack cut off under load**: not run ({c['skipped']}).\n\n"
    if not c.get("formed"):
        return (
            f"**A rack cut off under load**: the swarm of {c['nodes']:,} nodes on hosts apart "
            f"did not form ({c.get('alive', 0):,} alive when the suite stopped waiting).\n\n"
        )
    lost = c["failed"] + c["wrong"]
    within = c["down_p99_s"] is not None and c["down_p99_s"] <= 2.0
    one_plan = c["plans_until_repaired"] == 1
    verdicts = [
        f"every request answered right: {'met' if lost == 0 else 'not met'} "
        f"({c['answered']:,} answered, {c['failed']} failed, {c['wrong']} wrong)",
        f"the rack's nodes called down within 2 s at p99: {'met' if within else 'not met'} "
        f"(p50 {num(c['down_p50_s'], 2)} s, p99 {num(c['down_p99_s'], 2)} s, the last "
        f"{num(c['down_last_s'], 2)} s after the cut; {c['called_down']} of {c['cut']})",
        f"the plan repaired in one plan: {'met' if one_plan else 'not met'} "
        f"(plans published from the cut until one held none of the rack: "
        f"{c['plans_until_repaired']}, {num(c['repaired_s'], 1)} s after the cut, of which "
        "the planner's 5 s retirement wait)",
    ]
    said = "; ".join(verdicts)
    after = (
        f"Requests answered in the {num(c.get('after_s', 10.0), 0)} s after the cut: "
        f"{c['after_cut_requests']:,}, "
        f"p50 {num(c['after_cut_p50_ms'], 1)} ms, p99 {num(c['after_cut_p99_ms'], 1)} ms."
    )
    followed = (
        f" A router following telemetry meanwhile (from before the cut to the end of that "
        f"window) received {c['follow_bytes_per_s']:,} bytes a second "
        f"({num(c['follow_deltas_per_s'], 1)} deltas a second), read {c['follow_snapshots']} "
        f"snapshots again and missed {c['follow_gaps']} deltas."
        if "follow_bytes_per_s" in c
        else ""
    )
    back = (
        f"With the cable back, every node was alive and planned again {num(c['back_s'], 1)} s "
        "later."
        if c.get("back_s") is not None
        else "With the cable back, the rack was not all alive and planned again within 90 s."
    )
    return f"""**A rack cut off under load** (`hecate_dev.hosts`: every process on a host of
its own, a network namespace on one bridge; a NATS cluster of three servers, each on its
own host; the services on another; {c["racks"]} racks of {c["cut"]} nodes (`hecate
node-host`), each rack a host, on a {c["layers"]}-layer toy model): with {c["at_once"]}
requests at a time flowing, each answer checked against the single-process one, rack 0's
cable is pulled (its veth down). The swarm formed in {num(c["formed_s"], 1)} s.

{said[:1].upper()}{said[1:]}. {after}{followed} {back}

"""


def _run(lv: dict[str, Any]) -> str:
    """Which run of the suite a level is: its size, and what it ran with beyond one of
    each."""
    extra = [
        f"{lv[k]} {what}"
        for k, what in (("routers", "routers"), ("telemetry_shards", "telemetry replicas"))
        if lv.get(k, 1) > 1
    ]
    return f"{lv['nodes']:,} nodes" + (f" ({', '.join(extra)})" if extra else "")
