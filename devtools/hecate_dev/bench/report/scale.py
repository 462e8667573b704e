"""The scale section: what forming, beating and following a swarm costs per node, size by
size (``hecate bench scale``)."""

from __future__ import annotations

from typing import Any

from hecate_dev.bench.report.markdown import Doc, Target, num, provenance, table


def section_scale(env: Doc, img: str) -> tuple[str, list[Target]]:
    del img  # no picture for this suite yet
    r: dict[str, Any] = env["report"]
    meta = r["meta"]
    rows = [
        [
            f"{lv['nodes']:,}",
            str(lv["hosts"]),
            f"{lv['alive']:,}" + ("" if lv["formed"] else " (not all)"),
            num(lv["all_alive_s"], 1),
            num(lv.get("planned_s", 0.0), 1),
            f"{lv.get('pipelines', 0):,}",
            " + ".join(str(x) for x in lv["host_rss_mb"]),
            num(lv["host_cpu_us_per_node_per_s"], 0),
            num(lv["telemetry_cpu_per_s"], 3),
            num(lv["telemetry_cpu_us_per_beat"], 1),
            f"{lv['snapshot_bytes']:,}",
            num(lv.get("snapshot_updates_per_s", 0.0), 1),
            f"{lv.get('follow_bytes_per_s', 0):,}",
            num(lv.get("router_cpu_per_s", 0.0), 3),
        ]
        for lv in r["levels"]
    ]
    figures = table(
        [
            "nodes",
            "hosts",
            "alive",
            "all alive after (s)",
            "planned after (s)",
            "copies planned",
            "host RSS (MB)",
            "host CPU per node (µs/s)",
            "telemetry CPU (cores)",
            "telemetry CPU per beat (µs)",
            "snapshot (bytes)",
            "snapshot updates (/s)",
            "a router follows (bytes/s)",
            "router CPU (cores)",
        ],
        rows,
    )
    broke = [
        f"at {lv['nodes']:,} nodes a host exited: {why}"
        for lv in r["levels"]
        for why in lv.get("host_failures", [])[:1]
    ]
    broken = (
        "What broke: " + "; ".join(broke) + ". " if broke else "Every host stood at every size. "
    )
    text = f"""## A swarm of many nodes: what each node costs

{provenance(env)}
One nats-server, one telemetry service, one router, a planner and node hosts
(`hecate node-host`: up to
{meta["per_host"]:,} node identities in one process, each a whole node on the bus: its
own connections, subjects, heartbeats and plan watch) on the `{meta["executor"]}`
executor, every node beating every {meta["heartbeat_ms"]:,} ms. Per size: how long
after the hosts started telemetry called every node alive; how long the planner,
started then (as a restarted one is: it roll-calls every node), took to publish a plan
holding them all, its settle time included, and how many copies it planned
(`--pipelines auto`: a 48-layer base on nodes of 8 layers); the hosts' memory, the CPU
the hosts and telemetry spend per second once the swarm stands (over
{num(meta["steady_s"], 0)} s), the telemetry snapshot every router follows, whole, and
what following it costs a router with nothing to route: the updates and bytes it
receives a second, and its CPU.

{figures}

One identity adds {num(r["rss_added_per_node_mb"], 3)} MB to its host (the slope
between the two smallest sizes). The snapshot is one KV value: at
{r["levels"][-1]["snapshot_bytes_per_node"]} bytes a node it passes NATS's default 1 MB
max_payload near {r["snapshot_limit_nodes"]:,} nodes. {broken}Routing under load at
these sizes, several routers and a namespace cut off are not measured yet.
"""
    return text, []
