"""``hecate up``: a whole local swarm with one command.

Starts an embedded nats-server with JetStream (data under ``--state``), unless
``--nats URL`` names one, then each service as its own process, each started with the
very ``hecate <service> ...`` command an operator would type (``ps`` shows which is
which). One that exits, killed by hand or failed, is started again after a pause
(:mod:`hecate_launcher.keeping`). Logs stream with a service prefix.
Ctrl-C stops everything: services drain first, the server goes last. Ctrl-C (or SIGTERM)
while it is still starting, model pull included, stops whatever has started so far and
exits 130 (143); and since every child dies with its supervisor (:mod:`hecate_launcher`),
even a SIGKILLed ``hecate up`` leaves nothing running.

``--secure`` locks the bus down as a deployment would: one NATS user per service role
and per node of the topology (``node-<id>``: it joins, leaves, heartbeats and serves as
itself only) in the services' account, and one account per tenant importing inference
and cancels from it (``deploy/nats/accounts.conf``'s layout, derived from the wire
contract), fresh random passwords, and TLS with a throwaway CA, all under
``<state>/secure/`` (mode 0700). The routers take a request's tenant from the account
the server vouches for, and the gateway asks as each key's tenant with that tenant's
credentials. Each service gets its own user's credentials in its environment;
``<user>.env`` files there give a shell a tenant's or the operator's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client

from hecate.bus.connection import connect
from hecate.bus.secure import SecureBus, prepare
from hecate.bus.server import NatsServer
from hecate.cli.flags import pipelines
from hecate.core.errors import HecateError
from hecate.executors import generative_model
from hecate.sim.topology import parse_topology
from hecate.wire import subjects
from hecate.wire.messages import ServiceRestarted
from hecate.wire.permissions import OPERATOR
from hecate_launcher import (
    GATEWAY_KEYS,
    GATEWAY_URL,
    ProcessSpec,
    Supervisor,
    gateway_address,
    hecate_command,
    node_env,
    plan_commands,
    spawn,
)
from hecate_launcher.keeping import keep
from hecate_launcher.natsconfig import add_tenant_option, tenants

GATEWAY_KEY = "gateway.key"  # the local swarm's own key, readable by its owner only


def gateway_key(state: Path, tenant: str) -> Path:
    """The local swarm's API key, made on first use: its hash goes to the gateway's keys
    file, the key itself to ``<state>/gateway.key`` (mode 0600) for the operator's own
    clients. A key whose file is gone is made again. The key is made by the gateway's
    own command (``hecate keys add``), as an operator would: the keys file is the
    gateway's."""
    import subprocess

    path = state / GATEWAY_KEY
    if not path.exists():
        made = subprocess.run(
            [*hecate_command(), "keys", "add", tenant, "--file", str(state / GATEWAY_KEYS)],
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            raise HecateError(f"could not make the gateway's key: {made.stderr.strip()}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(made.stdout.strip() + "\n")
    return path


def _pretty(label: str, line: str) -> str:
    try:
        doc = json.loads(line)
    except json.JSONDecodeError:
        return f"{label:>14} | {line}"
    if not isinstance(doc, dict):
        return f"{label:>14} | {line}"
    skip = {"ts", "service", "id", "event", "level"}
    rest = " ".join(f"{k}={v}" for k, v in doc.items() if k not in skip)
    level = "" if doc.get("level") == "info" else f"[{doc.get('level')}] "
    return f"{label:>14} | {level}{doc.get('event', '')} {rest}".rstrip()


def _print_line(label: str, line: str) -> None:
    print(_pretty(label, line.rstrip()), flush=True)


# The gateway first (no new HTTP requests), then the planner (a swarm being shut down must
# not be re-planned around its departing nodes), then routers (no new requests), then
# nodes (drain), then the rest; the server goes last.
STOP_ORDER = ("gateway", "planner", "router", "node", "")
STOP_GRACE_S = 15.0


def generative_models(topology: Path) -> dict[str, bool]:
    """The model files the topology's nodes need pulled before they start, and for each
    whether a node runs it on the float32 reference (whose weights are then prepared
    once, not by each node at its start)."""
    nodes = parse_topology(topology.read_bytes()).nodes
    out: dict[str, bool] = {}
    for n in nodes:
        model = generative_model(n.executor)
        if model is not None:
            out[model] = out.get(model, False) or n.executor.endswith("-numpy")
    return dict(sorted(out.items()))


# A shell's convention: 128 + the signal's number.
EXIT_CODES: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}


@dataclasses.dataclass
class Startup:
    """What ``hecate up`` has started so far, so that a signal at any moment stops
    exactly that: the supervisor's children (the model pull among them) and the server."""

    supervisor: Supervisor
    step: str = "starting"
    server: NatsServer | None = None
    bus: SecureBus | None = None
    url: str = ""
    key_path: Path | None = None
    gateway_url: str = ""
    kept: list[str] = dataclasses.field(default_factory=list)  # started again if they exit


async def start(args: argparse.Namespace, run: Startup) -> None:
    """Everything up to the running swarm; cancelled by a signal at any await."""
    # A model none of the started nodes can execute would never be served: say so now.
    topology = parse_topology(Path(args.topology).read_bytes())
    topology.require_executors(topology.nodes)
    state = Path(args.state)
    state.mkdir(parents=True, exist_ok=True)
    for model, float32 in generative_models(Path(args.topology)).items():
        # A child like the others: a signal stops it (and the pip it runs) at once, and
        # the store renames the file into place only once it is whole and verified.
        run.step = f"pulling {model}"
        print(f"hecate up: pulling {model} (once)", flush=True)
        argv = ("model", "pull", model, *(["--float32"] if float32 else []))
        pull = run.supervisor.start(ProcessSpec("model pull", argv))
        code = await asyncio.to_thread(pull.wait)
        if code != 0:
            raise HecateError(f"could not pull {model} (exit {code}); see the lines above")
    url = args.nats
    if args.secure:
        if url is not None:
            raise HecateError("--secure starts its own locked-down server; drop --nats")
        run.step = "preparing the secure bus"
        nodes = [n.id for n in topology.nodes]
        run.bus = await asyncio.to_thread(prepare, state / "secure", tenants(args), nodes=nodes)
        run.bus.write_env_files()
    bus = run.bus
    if url is None:
        run.step = "starting the NATS server"
        print("hecate up: starting the NATS server", flush=True)
        run.server = NatsServer(
            state / "nats",
            max_payload=1024 * 1024,
            extra_config=bus.server_config(layout="accounts") if bus else "",
            env=bus.server_env() if bus else None,
            popen=spawn,
        )
        run.server.launch()  # here, not in a thread: stopping it must find its process
        await asyncio.to_thread(run.server.wait_ready)
        url = run.server.url
    run.url = url
    (state / "nats.url").write_text(url + "\n")
    if args.gateway != "off":
        gateway_address(args.gateway)  # a bad address fails before anything starts
        run.key_path = gateway_key(state, bus.tenants[0] if bus and bus.tenants else "default")
        (state / GATEWAY_URL).unlink(missing_ok=True)  # a previous run's
    run.step = "starting the services"
    identities = str(bus.tenant_identities) if bus else ""
    specs = plan_commands(args, url, identities=identities)
    print(f"hecate up: starting {len(specs)} services and nodes", flush=True)
    for spec in specs:
        # Under --secure each service logs in as its role, each node as itself.
        creds = bus.service_credentials(spec.argv).to_env() if bus else {}
        run.supervisor.start(dataclasses.replace(spec, env=creds))
        run.kept.append(spec.label)
        await asyncio.sleep(0)  # a signal between two starts is seen before the next
    if run.key_path is not None:
        run.step = "waiting for the gateway to listen"
        run.gateway_url = await gateway_listening(run.supervisor, state / GATEWAY_URL)


async def gateway_listening(supervisor: Supervisor, url_file: Path) -> str:
    """The URL the gateway listens on, once it does (port 0's choice included: the
    banner names the real one); a gateway that exits first (its port taken, say) fails
    the start, as a server that cannot start does, its own lines above saying why."""
    while not url_file.exists():
        code = supervisor.procs["gateway"].poll()
        if code is not None:
            raise HecateError(f"the gateway exited ({code}) before listening; see its lines above")
        await asyncio.sleep(0.05)
    return url_file.read_text().strip()


async def up(args: argparse.Namespace) -> int:
    """Start the swarm, serve until Ctrl-C (or SIGTERM), stop it: 0. A signal while it
    is still starting stops whatever has started and gives 130 (SIGINT) or 143."""
    state = Path(args.state)
    run = Startup(
        Supervisor(env=node_env(dict(os.environ, HECATE_STATE=str(state))), on_line=_print_line)
    )
    received: list[int] = []
    stop = asyncio.Event()
    starting = asyncio.create_task(start(args, run))

    def on_signal(sig: int) -> None:
        received.append(sig)
        stop.set()
        starting.cancel()  # a no-op once the swarm is up

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    interrupted = False
    try:
        try:
            await starting
        except asyncio.CancelledError:
            if not received:
                raise
        interrupted = bool(received)
        if not interrupted:
            _banner(args, run)
            async with keeping(run):
                if args.for_seconds:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), args.for_seconds)
                else:
                    await stop.wait()
    finally:
        if not interrupted:
            print("hecate up: stopping", flush=True)
        killed = await asyncio.to_thread(run.supervisor.stop, STOP_ORDER, STOP_GRACE_S)
        for label in killed:
            print(f"hecate up: {label} did not stop in {STOP_GRACE_S:g} s; killed it")
        if run.server is not None:
            await asyncio.to_thread(run.server.stop)
            (state / "nats.url").unlink(missing_ok=True)
    if interrupted:
        first = received[0]
        print(
            f"hecate up: {signal.Signals(first).name} while {run.step}: "
            "stopped everything started so far",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_CODES.get(first, 128 + first)
    return 0


@contextlib.asynccontextmanager
async def keeping(run: Startup) -> AsyncIterator[None]:
    """While the swarm serves, a service that exits is started again (:mod:`.keeping`),
    each restart said here and published, as the operator, for the swarm page."""
    creds = run.bus.credentials(OPERATOR) if run.bus is not None else None
    nc: Client | None = None
    try:
        nc = await connect(run.url, "hecate-up", timeout=5, credentials=creds)
    except Exception as exc:  # restarts go on, said here only
        print(f"hecate up: restarts will not be published: {exc!r}", flush=True)

    async def tell(restarted: ServiceRestarted) -> None:
        if nc is None:
            raise RuntimeError("not connected to the bus")
        await nc.publish(subjects.EVENT_RESTARTED, msgspec.json.encode(restarted))

    def say(line: str) -> None:
        print(f"hecate up: {line}", flush=True)

    task = asyncio.create_task(keep(run.supervisor, run.kept, tell=tell, say=say))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()


def _banner(args: argparse.Namespace, run: Startup) -> None:
    url, server, bus, key_path = run.url, run.server, run.bus, run.key_path
    print(
        f"hecate up: NATS at {url}"
        + (f" (monitor http://127.0.0.1:{server.monitor_port})" if server else "")
    )
    for label, proc in run.supervisor.procs.items():
        if proc.poll() is None:
            print(f"hecate up: {label:<12} pid {proc.pid}")
    topo = parse_topology(Path(args.topology).read_bytes())
    model = topo.request.model_id or topo.base.id
    if bus is not None:
        tenant = bus.tenants[0] if bus.tenants else "operator"
        print(
            f"hecate up: secure bus (TLS, one user per role and per node, one account "
            f"per tenant); tenants: "
            f"{', '.join(bus.tenants)}; credentials in {bus.directory}/<user>.env\n"
            f"hecate up: try  . {bus.directory}/{tenant}.env && "
            f'.venv/bin/hecate infer {model} "hello swarm"  and  '
            f". {bus.directory}/operator.env && .venv/bin/hecate status",
            flush=True,
        )
    else:
        print(
            f'hecate up: try  .venv/bin/hecate infer {model} "hello swarm"  and  '
            ".venv/bin/hecate status   (Ctrl-C stops everything)",
            flush=True,
        )
    if key_path is not None:
        base = run.gateway_url
        print(
            f"hecate up: OpenAI-compatible API at {base}/v1 (API key in {key_path}); "
            f"the live swarm page at {base}/\n"
            f"hecate up: try  curl {base}/v1/chat/completions "
            f'-H "Authorization: Bearer $(cat {key_path})" -H "Content-Type: application/json" '
            f'-d \'{{"model": "{model}", "messages": '
            f'[{{"role": "user", "content": "hello swarm"}}]}}\'',
            flush=True,
        )


def _cmd_up(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(up(args))
    except KeyboardInterrupt:  # before up() took Ctrl-C over: nothing had started yet
        print("hecate up: SIGINT before anything started", file=sys.stderr, flush=True)
        return EXIT_CODES[signal.SIGINT]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "up", help="start a local swarm: embedded NATS + every service as its own process"
    )
    p.add_argument("--topology", default="examples/swarm.json")
    p.add_argument("--nats", default=None, help="use this NATS server instead of starting one")
    p.add_argument("--state", default=".hecate", help="folder for the embedded server's data")
    p.add_argument("--routers", type=int, default=2)
    p.add_argument(
        "--telemetry-shards",
        type=int,
        default=1,
        choices=range(1, subjects.INTAKE_PARTITIONS + 1),
        metavar="1-16",
        help="telemetry replicas sharing the heartbeat intake, each judging its own nodes",
    )
    p.add_argument(
        "--telemetry-standby",
        action="store_true",
        help="a second telemetry replica of each shard, judging its nodes silently and "
        "taking over when the first stops renewing its lease",
    )
    p.add_argument(
        "--pipelines",
        type=pipelines,
        default="auto",
        help="base replicas, or 'auto' (the default): two, then as many as the nodes can "
        "form once the other models have theirs",
    )
    p.add_argument("--strategy", default="greedy")
    p.add_argument(
        "--secure",
        action="store_true",
        help="lock the bus down: a NATS user per role, node and tenant, TLS, random passwords",
    )
    add_tenant_option(p, "with --secure: a tenant user")
    p.add_argument(
        "--gateway",
        default="127.0.0.1:8000",
        metavar="HOST:PORT",
        help="where the OpenAI-compatible gateway and the swarm page listen (port 0: any "
        "free one, written to <state>/gateway.url), or off",
    )
    p.add_argument("--for-seconds", type=float, default=None, help=argparse.SUPPRESS)
    p.set_defaults(run=_cmd_up)
