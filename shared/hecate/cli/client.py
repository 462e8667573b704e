"""``hecate infer`` and ``hecate status``: a client's view of the swarm.

``hecate status`` calls a pipeline servable when the routers would send to it: every
node alive in the telemetry snapshot, none draining, and none behind a circuit that is
not closed (an open one refuses all traffic; a half-open one admits only its probe).
"intact" alone says only that telemetry hears every node; a swarm is healthy when every
pipeline is servable, and the headline names what stops the others."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import time
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError

from hecate.bus import kv as kvs
from hecate.bus import telemetry
from hecate.bus.service import connect
from hecate.cli.process import default_url
from hecate.client import HecateClient
from hecate.core import NodeProfile, NodeState, SwarmPlan, SwarmState
from hecate.resilience.breaker import BreakerSnapshot
from hecate.wire import subjects
from hecate.wire.messages import NodeTelemetry, StreamToken, TelemetrySnapshot


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


async def circuits(nc: Client) -> dict[str, bytes] | None:
    """Every circuit's stored state, by target (the breaker bucket; no bucket: no circuit
    ever written, all closed). None when the bucket cannot be read."""
    try:
        kv = await nc.jetstream().key_value(subjects.BREAKER_BUCKET)
    except BucketNotFoundError:
        return {}
    except Exception:
        return None
    found: dict[str, bytes] = {}
    try:
        async with asyncio.timeout(2.0):
            watcher = await kv.watchall()
            try:
                async for entry in watcher:  # the latest of every key, then None
                    if entry is None:
                        break
                    if entry.key is not None and entry.value:
                        found[entry.key] = entry.value
            finally:
                await watcher.stop()
    except Exception:
        return None
    return found


async def gather(url: str) -> dict[str, Any]:
    """Plan, telemetry, circuits and router statuses, straight from the bus."""
    nc = await connect(url, "hecate-cli", timeout=3)
    try:
        out: dict[str, Any] = {"plan": None, "epoch": 0, "telemetry": None, "routers": []}
        out["breakers"] = await circuits(nc)
        js = nc.jetstream()
        with contextlib.suppress(Exception):
            plans = await js.key_value(subjects.PLAN_BUCKET)
            value, revision = await kvs.get(plans, subjects.PLAN_KEY)
            if value:
                out["plan"], out["epoch"] = value, revision
        with contextlib.suppress(Exception):
            bucket = await js.key_value(subjects.TELEMETRY_BUCKET)
            # A snapshot is up to a few seconds old in a large swarm: the deltas after
            # it bring every node's liveness up to date.
            tel = await telemetry.read(bucket, nc=nc, listen_s=0.25)
            out["telemetry"] = msgspec.json.encode(tel) if tel is not None else None
        out["routers"] = await _answers(nc, f"$SRV.STATS.{subjects.SERVICE_NAMES['router']}")
        # Every service's PING: its metadata says whether its launcher restarted it.
        out["restarted"] = {
            f"{doc.get('name')} {doc.get('id')}": int(doc["metadata"]["restarts"])
            for doc in await _answers(nc, "$SRV.PING")
            if str((doc.get("metadata") or {}).get("restarts", "")).isdigit()
        }
        return out
    finally:
        await nc.close()


async def _answers(nc: Client, subject: str, listen_s: float = 0.3) -> list[dict[str, Any]]:
    """The JSON answers to ``subject`` heard within ``listen_s``."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(subject, b"", reply=inbox)
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + listen_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            msg = await sub.next_msg(timeout=left)
        except Exception:
            break
        if msg.data:  # not the server's no-responders status: nobody answers
            with contextlib.suppress(ValueError):
                out.append(json.loads(msg.data))
    await sub.unsubscribe()
    return out


_breaker = msgspec.json.Decoder(BreakerSnapshot)


def breaker_states(info: dict[str, Any]) -> dict[str, str]:
    """Each target whose circuit is not closed, and its state. From the breaker bucket;
    when that could not be read, the circuits the routers say are not closed."""
    stored = info.get("breakers")
    if stored is None:
        return {
            t: "open"
            for r in info["routers"]
            for e in r.get("endpoints", [])
            if e.get("name") == "infer"
            for t in (e.get("data") or {}).get("breakers_open", [])
        }
    out: dict[str, str] = {}
    for target, value in stored.items():
        try:
            snap = _breaker.decode(value)
        except msgspec.DecodeError:
            continue
        if snap.state != "closed":
            out[target] = snap.state
    return out


def _circuit(state: str | None) -> str:
    if state is None:
        return "closed"
    return {"open": "OPEN", "half_open": "probing"}.get(state, state)


def _blocker(
    node_id: str, heard: SwarmState, usable: SwarmState, blocked: dict[str, str]
) -> str | None:
    """Why a router would not send to ``node_id`` (None: it would)."""
    if not heard.is_alive(node_id):
        return "down:"
    if blocked.get(node_id) == "open":
        return "circuits open on"
    if node_id in blocked:
        return "probing"
    if not usable.is_alive(node_id):
        return "draining"
    return None


def render(info: dict[str, Any]) -> str:
    if info["plan"] is None:
        return "no plan published yet (is the planner running?)"
    plan = msgspec.json.decode(info["plan"], type=SwarmPlan)
    tel = (
        msgspec.json.decode(info["telemetry"], type=TelemetrySnapshot)
        if info["telemetry"]
        else None
    )
    blocked = breaker_states(info)
    now = time.time()
    lines = [
        f"plan epoch {info['epoch']}: {len(plan.pipelines)} pipelines, {len(plan.nodes)} nodes"
    ]
    heard: dict[str, NodeState] = {}  # what telemetry says
    usable: dict[str, NodeState] = {}  # what a router may send to
    unblocked: dict[str, NodeState] = {}  # and as its last resort (circuits aside)
    lines.append(
        f"{'node':<14}{'alive':<7}{'latency ms':>11}{'load':>7}{'in flight':>10}"
        f"{'seen s ago':>12}{'memory MiB':>18}  circuit"
    )
    for n in plan.nodes:
        t = tel.nodes.get(n.node_id) if tel else None
        alive = bool(t and t.alive)
        heard[n.node_id] = NodeState(alive=alive, last_seen=t.last_seen if t else None)
        unblocked[n.node_id] = NodeState(alive=alive and not (t and t.draining))
        usable[n.node_id] = NodeState(alive=unblocked[n.node_id].alive and n.node_id not in blocked)
        age = now - t.last_seen if t and t.last_seen else math.inf
        lat = f"{t.latency_ms:.2f}" if t and t.latency_ms is not None else "-"
        load = f"{t.load:.2f}" if t and t.load is not None else "-"
        shown = ("draining" if t and t.draining else "yes") if alive else "NO"
        lines.append(
            f"{n.node_id:<14}{shown:<7}{lat:>11}{load:>7}{(t.in_flight if t else 0):>10}"
            f"{age:>12.2f}{_memory(n, t):>18}  {_circuit(blocked.get(n.node_id))}"
        )
    state, servable_state = SwarmState(plan, heard), SwarmState(plan, usable)
    intact = servable = 0
    why: dict[str, list[str]] = {}
    lines.append("pipelines:")
    for p in plan.pipelines:
        ok, serves = state.pipeline_alive(p), servable_state.pipeline_alive(p)
        intact += ok
        servable += serves
        chain = " -> ".join(f"{s.node_id}[{s.layer_start}:{s.layer_end}]" for s in p.stages)
        shown = "servable" if serves else "blocked" if ok else "BROKEN"
        lines.append(f"  {p.pipeline_id:<16}{shown:<10}{chain}")
        for s in p.stages if not serves else ():
            cause = _blocker(s.node_id, state, servable_state, blocked)
            if cause is not None and s.node_id not in why.setdefault(cause, []):
                why[cause].append(s.node_id)
    live = len(state.live_nodes())
    total = len(plan.pipelines)
    health = "failed" if live == 0 else "healthy" if servable == total else "degraded"
    reasons = "; ".join(f"{cause} {', '.join(nodes)}" for cause, nodes in why.items())
    # Nothing servable, but copies only circuits block: the routers' last resort serves
    # through the open circuits (hecate.core.chooser, rule 5) rather than refuse.
    through = not servable and any(
        SwarmState(plan, unblocked).pipeline_alive(p) for p in plan.pipelines
    )
    last = "; routers serve through the open circuits" if through else ""
    lines.append(
        f"swarm: {health} ({servable}/{total} pipelines servable"
        f"{': ' + reasons if reasons else ''}; {intact}/{total} intact, "
        f"{live}/{len(plan.nodes)} nodes alive{last})"
    )
    for r in info["routers"]:
        data = next(
            (e.get("data") or {} for e in r.get("endpoints", []) if e.get("name") == "infer"), {}
        )
        lines.append(
            f"router {r.get('id')}: snapshot {data.get('snapshot')}, epoch "
            f"{data.get('plan_epoch')}, counters {data.get('counters')}"
        )
    for service, n in sorted(info.get("restarted", {}).items()):
        lines.append(f"restarted: {service}, {n} time{'s' if n != 1 else ''} since launch")
    return "\n".join(lines)


def _memory(node: NodeProfile, seen: NodeTelemetry | None) -> str:
    """A node's memory in use over its limit, in MiB ("-" for what it did not say),
    and where the limit comes from."""
    used = f"{seen.memory_used / 2**20:,.0f}" if seen and seen.memory_used else "-"
    if not node.memory_bytes:
        return used
    return f"{used}/{node.memory_bytes / 2**20:,.0f} {node.memory_from}"


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
