"""The swarm runs of ``hecate bench llm``: a router and SmolLM2 node processes on an
embedded nats-server, the plan written to KV directly (:func:`standing`). :func:`swarm`
starts one for a single streamed generation, timed (and, given ``kill_after``, a node
killed during it; see :mod:`hecate_dev.bench.llm`); :func:`side_by_side` keeps one on
each bus standing at once and times many generations on them in alternating pairs.

With ``secure`` the server is locked down as deployed, the layout ``hecate bench bus``
measures too (:data:`hecate_dev.bench.bus_setup.SECURE`): TLS, the services in one
account and each tenant in its own, every process logged in as its own user (each node
as its own), the router taking the tenant from the account the server stamps on each
request (``--tenant-from bus``), and the generation asked by a tenant from its account."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import numpy as np

from hecate.bus.credentials import Credentials
from hecate.bus.secure import SecureBus, prepare
from hecate.bus.server import NatsServer
from hecate.bus.streamed import request_streamed
from hecate.core import ModelSpec, NodeProfile, Pipeline, Stage, SwarmPlan
from hecate.wire import subjects
from hecate.wire.messages import FailoverEvent, InferReply, InferRequest, StreamToken
from hecate_dev.bench.bus_setup import ANONYMOUS, SECURE_LAYOUT, SECURE_TENANT
from hecate_dev.bench.llm_single import MODEL, PROMPT
from hecate_launcher import Supervisor, node_env
from hecate_planner.planstore import publish_by_hand


def _plan(pipelines: list[list[tuple[str, int, int]]], executor: str = "smollm2") -> SwarmPlan:
    nodes = sorted({n for p in pipelines for n, _, _ in p})
    return SwarmPlan(
        epoch=0,
        models=(ModelSpec(model_id=MODEL, layers=30, replicas=len(pipelines), executor=executor),),
        # What the nodes would have joined with: the model's executors here all take
        # generation steps (the plan carries the kind to the router).
        nodes=tuple(
            NodeProfile(node_id=n, capacity_layers=30, executor=executor, kind="steps")
            for n in nodes
        ),
        pipelines=tuple(
            Pipeline(
                pipeline_id=f"{MODEL}-r{i}",
                model_id=MODEL,
                stages=tuple(Stage(node_id=n, layer_start=a, layer_end=b) for n, a, b in p),
            )
            for i, p in enumerate(pipelines)
        ),
    )


# A streamed generation: its start, the first token's arrival, every token's, the
# failover reasons heard, the reply and the text as streamed.
Generated = tuple[float, float, list[float], list[str], InferReply, str]


async def _generate(
    url: str, tokens: int, on_token: Any = None, creds: Credentials = ANONYMOUS
) -> Generated:
    """One streamed generation: its start, token arrival times, failover reasons (none
    as a tenant, who may not hear the swarm's events), reply and the text as streamed."""
    nc = await nats.connect(url, **creds.options())
    stamps: list[float] = []
    reasons: list[str] = []
    streamed: list[StreamToken] = []

    async def failover(msg: Any) -> None:
        reasons.append(msgspec.json.decode(msg.data, type=FailoverEvent).reason)

    if creds is ANONYMOUS:
        await nc.subscribe(subjects.EVENT_FAILOVER, cb=failover)

    async def got(msg: Any) -> None:
        stamps.append(time.perf_counter())
        token = msgspec.json.decode(msg.data, type=StreamToken)
        streamed.append(token)
        if on_token is not None:
            on_token(token)

    body = InferRequest(prompt=PROMPT, max_tokens=tokens)
    t0 = time.perf_counter()
    msg = await request_streamed(
        nc, subjects.stream(MODEL), msgspec.json.encode(body), timeout=120, on_token=got
    )
    await nc.close()
    reply = msgspec.json.decode(msg.data, type=InferReply)
    if not reply.ok or not stamps:
        raise RuntimeError(f"generation failed: {reply.error}")
    text = "".join(t.text for t in sorted(streamed, key=lambda t: t.index))
    return t0, stamps[0], stamps, reasons, reply, text


async def _ready(url: str, creds: Credentials = ANONYMOUS) -> None:
    for _ in range(600):
        try:
            await _generate(url, 1, creds=creds)
            return
        except Exception:
            await asyncio.sleep(0.2)
    raise RuntimeError("the swarm never served the model")


@dataclasses.dataclass(frozen=True)
class Standing:
    """A swarm standing until its block ends: the server's URL, the user generations
    are asked as (a tenant's, on the locked-down bus) and the supervisor of its
    processes (to kill a node)."""

    url: str
    client: Credentials
    supervisor: Supervisor

    def generate(self, tokens: int, on_token: Any = None) -> Generated:
        return asyncio.run(_generate(self.url, tokens, on_token, self.client))

    def timed(self, tokens: int) -> dict[str, Any]:
        """One streamed generation's figures, its text unchecked (see :func:`figures`)."""
        return figures(self.generate(tokens))


@contextlib.contextmanager
def standing(
    pipelines: list[list[tuple[str, int, int]]],
    *,
    dispatch: str = "chain",
    blas_threads: int = 1,
    secure: bool = False,
    node_url: Callable[[str, str], str] | None = None,
    otlp: str | None = None,
    executor: str = "smollm2",
    router_args: tuple[str, ...] = (),
) -> Iterator[Standing]:
    """A nats-server, telemetry, a router and one SmolLM2 node process per stage, the
    plan written to KV, serving the model when the block starts; every process and the
    server are stopped when it ends, however it ends. With ``secure`` the bus is locked
    down as the module says. ``node_url(node, server_url)``: the URL that node is given
    instead of the server's (a fault proxy's, to put the node at the far end of a slow
    link). ``otlp``: an OTLP/HTTP endpoint every process exports its spans to (none
    otherwise, whatever the environment says: spans cost time). ``executor``: the nodes'
    (``smollm2-numpy``: the float32 reference). ``router_args``: flags added to the
    router's command."""
    env = node_env(dict(os.environ, HECATE_LOG_LEVEL="WARNING"), threads=blas_threads)
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    if otlp is not None:
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=otlp, OTEL_BSP_SCHEDULE_DELAY="200")
    node_ids = sorted({n for p in pipelines for n, _, _ in p})
    with tempfile.TemporaryDirectory() as tmp:
        bus: SecureBus | None = prepare(Path(tmp) / "secure", nodes=node_ids) if secure else None
        server = NatsServer(
            Path(tmp) / "nats",
            extra_config=bus.server_config(layout=SECURE_LAYOUT) if bus else "",
            env=bus.server_env() if bus else None,
        ).start()
        supervisor = Supervisor(env=env)

        def run(label: str, *argv: str, url: str = server.url) -> None:
            """``hecate <argv>``, as its own user on a locked-down bus."""
            creds = bus.service_credentials(argv).to_env() if bus else {}
            supervisor.run(label, *argv, "--nats", url, **creds)

        try:

            async def write_plan() -> None:
                planner = bus.credentials("planner") if bus else ANONYMOUS
                nc = await nats.connect(server.url, **planner.options())
                await publish_by_hand(nc, _plan(pipelines, executor))
                await nc.close()

            asyncio.run(write_plan())
            run("telemetry", "telemetry", "--id", "telemetry")
            vouched = ("--tenant-from", "bus") if bus else ()
            router = ("--id", "bench", "--stage-timeout-ms", "5000", "--dispatch", dispatch)
            run("router", "router", *router, *vouched, *router_args)
            for node in node_ids:
                layers = ("--capacity-layers", "30", "--executor", executor)
                url = node_url(node, server.url) if node_url else server.url
                run(node, "node", "--id", node, *layers, url=url)
            client = bus.credentials(SECURE_TENANT) if bus else ANONYMOUS
            asyncio.run(_ready(server.url, client))
            yield Standing(server.url, client, supervisor)
        finally:
            supervisor.stop(grace_s=15)
            server.stop()


@contextlib.contextmanager
def serving(
    pipelines: list[list[tuple[str, int, int]]],
    *,
    dispatch: str = "chain",
    blas_threads: int = 1,
    node_url: Callable[[str, str], str] | None = None,
) -> Iterator[str]:
    """The swarm :func:`swarm` times, on the open bus, serving until the block ends, for
    a caller that times its own generations; yields the server's URL (``node_url``: see
    :func:`standing`)."""
    with standing(pipelines, dispatch=dispatch, blas_threads=blas_threads, node_url=node_url) as s:
        yield s.url


def figures(generated: Generated, *, killed: bool = False) -> dict[str, Any]:
    """A generation's figures: TTFT, tokens/s after the first token, the median gap,
    ``tokens`` streamed and ``decode_s`` from the first to the last (what pooled
    tokens/s add up), with a kill the longest gap and how the router heard; and its
    text, as replied and as streamed, for the caller to check."""
    t0, first, stamps, reasons, reply, streamed = generated
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    out: dict[str, Any] = {
        "ttft_ms": round((first - t0) * 1000, 1),
        "tokens_per_s": round((len(stamps) - 1) / (stamps[-1] - first), 1),
    }
    out["gap_ms"] = round(float(np.median(gaps)) * 1000, 1)
    out["tokens"] = len(stamps)
    out["decode_s"] = round(stamps[-1] - first, 4)
    if killed:
        out["kill_stall_ms"] = round(max(gaps) * 1000, 1)
        out["failover_reason"] = reasons[0] if reasons else "none"
    out["text"] = reply.output or ""
    out["streamed_text"] = streamed
    return out


def swarm(
    pipelines: list[list[tuple[str, int, int]]],
    tokens: int,
    kill_after: int | None = None,
    *,
    kill_delay_s: float = 0.0,
    dispatch: str = "chain",
    blas_threads: int = 1,
    secure: bool = False,
) -> dict[str, Any]:
    """A swarm started for one timed generation and stopped after it (its
    :func:`figures`); given ``kill_after``, the middle node of the route an idle
    swarm takes is killed during it."""
    if secure and kill_after is not None:
        raise ValueError("a tenant may not hear failover events: kill on the open bus")
    with standing(pipelines, dispatch=dispatch, blas_threads=blas_threads, secure=secure) as s:
        # On an idle swarm the next generation takes the route this probe took.
        probe = s.generate(1)[4].route
        assert probe is not None
        victim = probe.stages[len(probe.stages) // 2].node_id

        def maybe_kill(token: StreamToken) -> None:
            if kill_after is not None and token.index == kill_after - 1:
                if kill_delay_s:  # aim at the victim's share of the next step
                    threading.Timer(kill_delay_s, s.supervisor.kill, (victim,)).start()
                else:
                    s.supervisor.kill(victim, wait=False)

        generated = s.generate(tokens, maybe_kill)
    return figures(generated, killed=kill_after is not None)


def side_by_side(
    pipelines: list[list[tuple[str, int, int]]],
    tokens: int,
    *,
    pairs: int,
    warmup: int = 2,
    blas_threads: int = 1,
) -> list[dict[str, Any]]:
    """The same swarm on the open bus and on the locked-down one, both standing at once,
    each warmed up with ``warmup`` untimed generations, then ``pairs`` pairs of timed
    generations, one on each, which goes first alternating pair by pair (open first in
    the first). Each pair: ``first`` (``"open"`` or ``"secure"``), ``stages_3`` (the
    open bus's :func:`figures`) and ``stages_3_secure``; texts unchecked."""
    with (
        standing(pipelines, blas_threads=blas_threads) as open_bus,
        standing(pipelines, blas_threads=blas_threads, secure=True) as locked,
    ):
        sides = {"stages_3": open_bus, "stages_3_secure": locked}
        for _ in range(warmup):
            for side in sides.values():
                side.generate(tokens)
        out = []
        for k in range(pairs):
            order = list(sides) if k % 2 == 0 else list(reversed(sides))
            pair: dict[str, Any] = {"first": "open" if k % 2 == 0 else "secure"}
            for name in order:
                pair[name] = sides[name].timed(tokens)
            out.append(pair)
    return out
