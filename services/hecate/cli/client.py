"""``hecate infer`` and ``hecate status``: a client's view of the swarm."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from typing import Any

import msgspec

from hecate.bus.service import connect
from hecate.cli.services import default_url
from hecate.client import HecateClient
from hecate.core import NodeState, SwarmPlan, SwarmState
from hecate.wire import subjects
from hecate.wire.messages import StreamToken, TelemetrySnapshot


async def infer(
    url: str, model: str, prompt: str, max_tokens: int, timeout: float, as_json: bool
) -> int:
    """One request through the SDK: bounded retries, Retry-After honoured, idempotent."""
    client = HecateClient(
        await connect(url, "hecate-cli", timeout=3), timeout_s=timeout, owns_connection=True
    )
    try:
        started = time.perf_counter()
        streamed: list[str] = []

        def show(token: StreamToken) -> None:  # tokens as they arrive (generative models)
            if not as_json:
                sys.stdout.write(token.text)
                sys.stdout.flush()
            streamed.append(token.text)

        reply = await client.infer(model, prompt, max_tokens=max_tokens, on_token=show)
        elapsed_ms = (time.perf_counter() - started) * 1000
    finally:
        await client.close()
    if as_json:
        print(msgspec.json.encode(reply).decode())
        return 0 if reply.ok else 1
    if not reply.ok:
        err = reply.error
        print(f"error {err.code if err else '?'}: {err.message if err else ''}", file=sys.stderr)
        return 1
    print("" if streamed else reply.output)
    route = reply.route
    chain = " -> ".join(
        f"{s.node_id}[{s.layer_start}:{s.layer_end}]" for s in (route.stages if route else ())
    )
    flags = " DEGRADED (reserve model)" if reply.degraded else ""
    print(
        f"-- {elapsed_ms:.1f} ms, {reply.attempts} attempt(s), "
        f"{route.pipeline_id if route else '?'}: {chain}{flags}",
        file=sys.stderr,
    )
    return 0


async def gather(url: str) -> dict[str, Any]:
    """Plan, telemetry and router statuses, straight from the bus."""
    nc = await connect(url, "hecate-cli", timeout=3)
    try:
        out: dict[str, Any] = {"plan": None, "epoch": 0, "telemetry": None, "routers": []}
        for bucket, key, name in (
            (subjects.PLAN_BUCKET, subjects.PLAN_KEY, "plan"),
            (subjects.TELEMETRY_BUCKET, subjects.TELEMETRY_KEY, "telemetry"),
        ):
            try:
                entry = await (await nc.jetstream().key_value(bucket)).get(key)
            except Exception:
                continue
            if entry.value:
                out[name] = entry.value
                if name == "plan":
                    out["epoch"] = int(entry.revision or 0)
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish(f"$SRV.STATS.{subjects.SERVICE_NAMES['router']}", b"", reply=inbox)
        deadline = time.monotonic() + 0.3
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = await sub.next_msg(timeout=left)
            except Exception:
                break
            out["routers"].append(json.loads(msg.data))
        return out
    finally:
        await nc.close()


def render(info: dict[str, Any]) -> str:
    if info["plan"] is None:
        return "no plan published yet (is the planner running?)"
    plan = msgspec.json.decode(info["plan"], type=SwarmPlan)
    tel = (
        msgspec.json.decode(info["telemetry"], type=TelemetrySnapshot)
        if info["telemetry"]
        else None
    )
    now = time.time()
    lines = [
        f"plan epoch {info['epoch']}: {len(plan.pipelines)} pipelines, {len(plan.nodes)} nodes"
    ]
    nodes: dict[str, NodeState] = {}
    lines.append(
        f"{'node':<14}{'alive':<7}{'latency ms':>11}{'load':>7}{'in flight':>10}{'seen s ago':>12}"
    )
    for n in plan.nodes:
        t = tel.nodes.get(n.node_id) if tel else None
        nodes[n.node_id] = NodeState(
            alive=bool(t and t.alive), last_seen=t.last_seen if t else None
        )
        age = now - t.last_seen if t and t.last_seen else math.inf
        lat = f"{t.latency_ms:.2f}" if t and t.latency_ms is not None else "-"
        load = f"{t.load:.2f}" if t and t.load is not None else "-"
        lines.append(
            f"{n.node_id:<14}{('yes' if t and t.alive else 'NO'):<7}{lat:>11}"
            f"{load:>7}{(t.in_flight if t else 0):>10}{age:>12.2f}"
        )
    state = SwarmState(plan, nodes)
    intact = 0
    lines.append("pipelines:")
    for p in plan.pipelines:
        ok = state.pipeline_alive(p)
        intact += ok
        chain = " -> ".join(f"{s.node_id}[{s.layer_start}:{s.layer_end}]" for s in p.stages)
        lines.append(f"  {p.pipeline_id:<16}{'intact' if ok else 'BROKEN':<8}{chain}")
    live = len(state.live_nodes())
    health = "failed" if live == 0 else "healthy" if intact == len(plan.pipelines) else "degraded"
    lines.append(
        f"swarm: {health} ({intact}/{len(plan.pipelines)} pipelines intact, "
        f"{live}/{len(plan.nodes)} nodes alive)"
    )
    for r in info["routers"]:
        data = next(
            (e.get("data") or {} for e in r.get("endpoints", []) if e.get("name") == "infer"), {}
        )
        lines.append(
            f"router {r.get('id')}: snapshot {data.get('snapshot')}, epoch "
            f"{data.get('plan_epoch')}, counters {data.get('counters')}"
        )
    return "\n".join(lines)


def _cmd_infer(args: argparse.Namespace) -> int:
    return asyncio.run(
        infer(args.nats, args.model, args.prompt, args.max_tokens, args.timeout, args.json)
    )


def _cmd_status(args: argparse.Namespace) -> int:
    info = asyncio.run(gather(args.nats))
    print(render(info))
    return 0


def add_parsers(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("infer", help="send one request, print answer")
    p.add_argument("model")
    p.add_argument("prompt")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--json", action="store_true", help="print the raw JSON reply")
    p.add_argument("--nats", default=default_url())
    p.set_defaults(run=_cmd_infer)

    s: argparse.ArgumentParser = sub.add_parser("status", help="nodes, pipelines, health")
    s.add_argument("--nats", default=default_url())
    s.set_defaults(run=_cmd_status)
