"""The processes of a swarm: each service's command (the very ``hecate <service> ...``
an operator would type), in start order, and the environment a compute process gets.

``hecate up`` and the benchmarks that stand up ``make run``'s swarm take their
:class:`ProcessSpec` list from :func:`plan_commands`, so a swarm started by any of them
is the same swarm.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hecate.core.errors import HecateError
from hecate.core.telemetry import BEAT_BUDGET_PER_S
from hecate.executors import generative_model
from hecate.sim.topology import NodeEntry, parse_topology
from hecate_launcher.supervisor import ProcessSpec


def args_standby(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "telemetry_standby", False))


def plan_commands(args: argparse.Namespace, url: str, *, identities: str = "") -> list[ProcessSpec]:
    """Every process of the swarm, in start order. ``identities``: on a bus with an
    account per tenant, the directory of the tenants' credentials: the routers take a
    request's tenant from the bus, and the gateway asks as each key's tenant."""
    topo = parse_topology(Path(args.topology).read_bytes())
    common = ["--nats", url]
    # Executors whose last stage samples tokens: their routers chain the stages (each
    # step's hidden state goes node to node; a replay restarts from the prompt anyway).
    generative = any(generative_model(n.executor) for n in topo.nodes)
    routing = ["--dispatch", "chain"] if generative else []
    if identities:
        routing += ["--tenant-from", "bus"]
    # Telemetry: one replica, or replicas sharing the heartbeat intake, each its own
    # partitions; with a standby, a second replica of each, silent until it takes over.
    shards = getattr(args, "telemetry_shards", 1)
    # Each replica takes its share of the beats: the swarm's budget grows with them.
    budget = BEAT_BUDGET_PER_S * shards
    paced = ["--heartbeat-budget-per-s", f"{budget:g}"] if shards > 1 else []
    cmds: list[tuple[str, list[str]]] = []
    for k in range(shards):
        sharded = ["--shards", str(shards), "--shard", str(k)] if shards > 1 else []
        name = f"telemetry-{k}" if shards > 1 else "telemetry"
        for label in (name, f"{name}-standby") if args_standby(args) else (name,):
            cmds.append((label, ["telemetry", *common, "--id", label, *sharded]))
    cmds += [
        (
            "planner",
            [
                "planner",
                *common,
                "--id",
                "planner",
                "--topology",
                args.topology,
                "--strategy",
                args.strategy,
                "--pipelines",
                str(args.pipelines),
            ],
        ),
        ("breaker", ["breaker", *common, "--id", "breaker"]),
    ]
    for i in range(1, args.routers + 1):
        cmds.append(
            (
                f"router-{i}",
                ["router", *common, "--id", f"router-{i}", "--topology", args.topology, *routing],
            )
        )
    for n in topo.nodes:
        cmds.append((f"node {n.id}", [*node_argv(n), *paced, *common]))
    # Callers that build a swarm for a measurement leave the gateway out.
    if getattr(args, "gateway", "off") != "off":
        host, port = gateway_address(args.gateway)
        keys = str(Path(args.state) / GATEWAY_KEYS)
        gateway = ["gateway", *common, "--host", host, "--port", str(port), "--keys", keys]
        gateway += ["--url-file", str(Path(args.state) / GATEWAY_URL)]
        if identities:
            gateway += ["--tenant-identities", identities]
        cmds.append(("gateway", gateway))
    return [ProcessSpec(label, tuple(argv)) for label, argv in cmds]


GATEWAY_KEYS = "gateway-keys.json"  # hashes only
GATEWAY_URL = "gateway.url"  # where the gateway listens, written once it does


def gateway_address(spec: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``PORT``) of ``--gateway``."""
    host, _, port = spec.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise HecateError(f"--gateway {spec!r}: expected HOST:PORT, PORT or off") from None
    if not 0 <= number <= 65535:
        raise HecateError(f"--gateway {spec!r}: no such port")
    return host or "127.0.0.1", number


def node_argv(n: NodeEntry) -> list[str]:
    """``hecate node ...`` for a topology's node (without ``--nats``)."""
    return [
        "node",
        "--id",
        n.id,
        "--capacity-layers",
        str(n.capacity_layers),
        "--latency-ms",
        str(n.latency_ms),
        "--score",
        str(n.score),
        *(["--executor", n.executor] if n.executor != "toy" else []),
    ]


# OpenBLAS lets an idle worker thread spin 2^N cycles before it sleeps (default N=28,
# about 0.1 s). A stage whose threads spin that long after its step starves the next
# stage of the same token on shared cores (measured: 3 stages fell to ~6 tokens/s);
# sleeping after every call (N=4) pays a wake-up per matmul. N=20 (~0.4 ms) keeps the
# threads awake across one step's calls and asleep soon after it (hecate bench llm).
BLAS_THREAD_TIMEOUT = "20"


def node_env(base: dict[str, str], threads: int | None = None) -> dict[str, str]:
    """Compute threads for service processes: one each (the engine's,
    ``HECATE_ENGINE_THREADS``, and BLAS's, with a short spin). A local swarm runs several
    compute processes on the same cores: when many users keep them all busy, two threads
    per process fight over the cores (a two-row product took 523 ms against 46 ms with
    one thread at a load of 6-7), and one user's stages run one at a time anyway (a
    10-block stage's step on the engine: 2.40 ms on one thread, 4.06 on two that do not
    spin, measured by ``hecate bench llm``). What the operator set wins."""
    env = dict(base)
    if threads is not None:
        env["OPENBLAS_NUM_THREADS"] = str(threads)
        env["HECATE_ENGINE_THREADS"] = str(threads)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("HECATE_ENGINE_THREADS", "1")
    env.setdefault("OPENBLAS_THREAD_TIMEOUT", BLAS_THREAD_TIMEOUT)
    return env
