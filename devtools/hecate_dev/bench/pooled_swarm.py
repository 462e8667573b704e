"""HECATE's side of the pooled run: a model no node can hold, over node processes each in
a memory cgroup, beside llama.cpp's RPC split of the same file (:mod:`.pooled`).

On an embedded nats-server: telemetry, a router, the planner (one pipeline, the members'
profiles planned as soon as they change) and ``nodes`` processes of ``hecate node``,
each in a cgroup v1 memory group of ``limit_bytes`` from its first instruction, each
with one engine thread (as each ``ggml-rpc-server`` has one) and a KV budget of
``kv_positions`` positions a layer (as ``llama-server -c``). The first node is told to
hold every layer (``--capacity-layers``): in that limit it must refuse before loading,
naming the bytes, and join again with what fits; the others join with what their
memory fits. Then, once the plan covers the model: the load time, tokens/s at each
count of users at once (each user a greedy generation of ``max_tokens`` of one of
:data:`.pooled.PROMPTS`), every answer checked against what one unconstrained process
answers (:func:`hecate.llm.reference.greedy_text`, in a process of its own), and each
node's group peak, resident memory, layers and OOM kills.
"""

# ruff: noqa: RUF001

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import msgspec
import nats

from hecate.bus import kv as kvs
from hecate.bus.server import NatsServer
from hecate.core import SwarmPlan
from hecate.llm.gguf_file import GGUFFile
from hecate.llm.gguf_model import read_config
from hecate.wire import subjects
from hecate.wire.messages import InferReply, InferRequest
from hecate_dev.bench.interval import Verdict, median_interval
from hecate_dev.bench.pooled import MIB, PROMPTS, RpcArm, RpcSplit, rpc_standing, vm
from hecate_dev.cgroups import MemoryCgroup, available
from hecate_launcher.supervisor import ProcessSpec, Supervisor, hecate_command

REFUSED = "ranges refused: they do not fit this node's memory"


class NodeUse(msgspec.Struct, frozen=True, kw_only=True):
    """One node: its group's limit and peak (MiB; the peak counts the file's pages it
    read, which the kernel may take back), its resident memory after the runs, the
    layers its memory fits (as it weighed them) and those the plan gave it, and
    whether the OOM killer took it."""

    node_id: str
    limit_mib: float
    cgroup_max_mib: float
    resident_mib: float | None
    fit_layers: int | None
    layers: tuple[int, int] | None
    oom_killed: bool
    exit_code: int | None


class HecateSplit(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """HECATE's split of ``file`` over ``nodes`` nodes of ``limit_mib`` each."""

    file: str
    file_mib: float
    nodes: int
    limit_mib: float
    max_tokens: int
    kv_positions: int
    #: the first node's refusal of the whole model, as it logged it
    refused: str | None = None
    load_s: float | None = None
    #: by users at once: the median of the rounds, and each round's
    tokens_per_s: dict[str, float] = {}
    per_round: dict[str, list[float]] = {}
    #: every answer equal to one unconstrained process's
    answers_equal: bool | None = None
    differing: list[str] = []
    node_use: list[NodeUse] = []
    skipped: str | None = None
    failed: str | None = None

    def summary(self) -> str:
        name = Path(self.file).stem
        if self.skipped:
            return f"hecate split {name}: skipped: {self.skipped}"
        held = ", ".join(
            f"{u.node_id} {u.layers}: {u.cgroup_max_mib:.0f}"
            + (" OOM-killed" if u.oom_killed else "")
            for u in self.node_use
        )
        rates = ", ".join(f"{v:.1f} at {k}" for k, v in self.tokens_per_s.items())
        load = "-" if self.load_s is None else f"{self.load_s:.1f}"
        return (
            f"hecate split {name}: {self.nodes} nodes of {self.limit_mib:.0f} MiB: peaks "
            f"{held} MiB; loaded in {load} s; tokens/s {rates or '-'} users; answers "
            f"equal: {self.answers_equal}; refused alone: {self.refused is not None}"
            + (f"; FAILED {self.failed}" if self.failed else "")
        )


def expected(file: Path, prompts: Sequence[str], tokens: int) -> list[str]:
    """What one unconstrained process answers to each prompt, greedy (in a process of
    its own, which gives its memory back as it ends)."""
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from hecate.llm.reference import greedy_text\n"
        "path, tokens, prompts = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])\n"
        "print(json.dumps([greedy_text(path, p, tokens) for p in prompts]))\n"
    )
    argv = [sys.executable, "-c", code, str(file), str(tokens), json.dumps(list(prompts))]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    texts: list[str] = json.loads(out.stdout.splitlines()[-1])
    return texts


def _logged(supervisor: Supervisor, label: str, event: str) -> list[dict[str, Any]]:
    try:
        lines = supervisor.log(label).splitlines()
    except OSError:
        return []
    return [json.loads(line) for line in lines if f'"event": "{event}"' in line]


async def _plan(url: str) -> SwarmPlan | None:
    nc = await nats.connect(url)
    try:
        kv = await kvs.bucket(nc, subjects.PLAN_BUCKET)
        entry = await kv.get(subjects.PLAN_KEY)
        return msgspec.json.decode(entry.value or b"", type=SwarmPlan)
    except Exception:
        return None
    finally:
        await nc.close()


async def _ask(url: str, model: str, prompts: Sequence[str], tokens: int) -> list[InferReply]:
    nc = await nats.connect(url)
    try:

        async def one(prompt: str) -> InferReply:
            body = msgspec.json.encode(InferRequest(prompt=prompt, max_tokens=tokens))
            msg = await nc.request(subjects.infer(model), body, timeout=900)
            return msgspec.json.decode(msg.data, type=InferReply)

        return list(await asyncio.gather(*(one(p) for p in prompts)))
    finally:
        await nc.close()


def _serving(url: str, model: str, timeout_s: float) -> float:
    """Seconds until the swarm answers a one-token request."""
    started = time.monotonic()
    last: object = None
    while time.monotonic() - started < timeout_s:
        try:
            reply = asyncio.run(_ask(url, model, ["Hello"], 1))[0]
            if reply.ok:
                return time.monotonic() - started
            last = reply.error
        except Exception as exc:  # not serving yet: the bus says so as a timeout
            last = exc
        time.sleep(1)
    raise TimeoutError(f"not serving after {timeout_s:.0f}s: {last!r}")


class HecateArm:
    """HECATE's split standing (:func:`hecate_standing`): generations timed on it, each
    answer checked (:meth:`rate`), its figures once they are (:meth:`result`)."""

    def __init__(self, base: HecateSplit, want: dict[str, str], limit_bytes: int) -> None:
        self.base, self.want, self.limit_bytes = base, want, limit_bytes
        self.url: str | None = None
        self.model = ""
        self.supervisor: Supervisor | None = None
        self.ids: list[str] = []
        self.groups: list[MemoryCgroup] = []
        self.refused: str | None = None
        self.load_s: float | None = None
        self.failed: str | None = None
        self.differing: list[str] = []
        self.answered = 0

    def rate(self, users: int, tokens: int) -> float:
        """Tokens/s of ``users`` greedy generations of ``tokens`` at once (each user one
        of :data:`.pooled.PROMPTS`), every answer checked against one process's."""
        if self.url is None:
            raise RuntimeError(f"not serving: {self.failed}")
        asked = [PROMPTS[i % len(PROMPTS)] for i in range(users)]
        started = time.perf_counter()
        replies = asyncio.run(_ask(self.url, self.model, asked, tokens))
        elapsed = time.perf_counter() - started
        for prompt, reply in zip(asked, replies, strict=True):
            if not reply.ok:
                self.failed = f"{users} users: {reply.error}"
                raise RuntimeError(self.failed)
            self.answered += 1
            if reply.output != self.want[prompt]:
                self.differing.append(f"{users} users, {prompt!r}: {reply.output!r}")
        return sum(r.completion_tokens or 0 for r in replies) / elapsed

    def result(self, per_round: dict[str, list[float]]) -> HecateSplit:
        """The split's figures now: each node's memory and layers, tokens/s by users
        (the median of ``per_round``), whether every answer was one process's."""
        use = []
        if self.supervisor is not None:
            plan = asyncio.run(_plan(self.url)) if self.url else None
            stages = [s for p in (plan.pipelines if plan else ()) for s in p.stages]
            held = {s.node_id: (s.layer_start, s.layer_end) for s in stages}
            for n, group in zip(self.ids, self.groups, strict=True):
                weighed = _logged(self.supervisor, n, "memory weighed")
                counters = group.use()
                alive = self.supervisor.alive(n)
                resident = vm(self.supervisor.pid(n)).get("VmRSS") if alive else None
                use.append(
                    NodeUse(
                        node_id=n,
                        limit_mib=round(self.limit_bytes / MIB),
                        cgroup_max_mib=round(counters.max_usage / MIB),
                        resident_mib=round(resident) if resident is not None else None,
                        fit_layers=int(weighed[0]["fit"]) if weighed else None,
                        layers=held.get(n),
                        oom_killed=counters.oom_killed,
                        exit_code=self.supervisor.procs[n].poll(),
                    )
                )
        return msgspec.structs.replace(
            self.base,
            refused=self.refused,
            load_s=round(self.load_s, 1) if self.load_s is not None else None,
            tokens_per_s={k: round(statistics.median(v), 2) for k, v in per_round.items() if v},
            per_round={k: [round(x, 2) for x in v] for k, v in per_round.items()},
            answers_equal=None if self.failed or not self.answered else not self.differing,
            differing=self.differing[:8],
            node_use=use,
            failed=self.failed,
        )


@contextmanager
def hecate_standing(
    file: Path,
    name: str,
    nodes: int = 3,
    limit_bytes: int = 3 * 2**29,
    *,
    max_tokens: int = 64,
    kv_positions: int = 4096,
    load_timeout_s: float = 900,
) -> Iterator[HecateArm]:
    """HECATE's split of ``file`` (registered as ``name`` in a model cache of its own)
    over ``nodes`` nodes in cgroups of ``limit_bytes``, as the module says, standing
    until the block ends; the arm's ``failed`` says why it could not serve."""
    size = file.stat().st_size
    base = HecateSplit(
        file=str(file),
        file_mib=round(size / MIB),
        nodes=nodes,
        limit_mib=round(limit_bytes / MIB),
        max_tokens=max_tokens,
        kv_positions=kv_positions,
    )
    if not (ok := available()):
        yield HecateArm(msgspec.structs.replace(base, skipped=ok.reason), {}, limit_bytes)
        return
    want = dict(zip(PROMPTS, expected(file, PROMPTS, max_tokens), strict=True))
    arm = HecateArm(base, want, limit_bytes)
    arm.model, arm.ids = name, [f"n{i}" for i in range(nodes)]
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        env = dict(
            os.environ,
            HECATE_MODELS=f"{tmp}/models",
            HECATE_LOG_LEVEL="INFO",
            HECATE_ENGINE_THREADS="1",
            HECATE_KV_POSITIONS=str(kv_positions),
            OPENBLAS_NUM_THREADS="1",
        )
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        add = [*hecate_command(), "model", "add", name, str(file)]
        subprocess.run(add, env=env, check=True, capture_output=True)
        layers = read_config(GGUFFile(file)).layers
        topology = Path(tmp) / "pooled.json"
        node_entries = [{"id": n, "capacity_layers": layers, "executor": name} for n in arm.ids]
        model = {"id": name, "layers": layers, "executor": name}
        topology.write_text(json.dumps({"models": [model], "nodes": node_entries}))
        server = NatsServer(Path(tmp) / "nats").start()
        stack.callback(server.stop)
        supervisor = arm.supervisor = Supervisor(env=env, logs=Path(tmp))
        stack.callback(supervisor.stop, grace_s=15)
        url = ("--nats", server.url)
        supervisor.run("telemetry", "telemetry", "--id", "telemetry", *url)
        supervisor.run("router", "router", "--id", "router", "--stage-timeout-ms", "60000", *url)
        planner = ("--topology", str(topology), "--pipelines", "1", "--profile-pace-ms", "200")
        supervisor.run("planner", "planner", "--id", "planner", *planner, *url)
        arm.groups = [
            stack.enter_context(MemoryCgroup(f"hecate-{os.getpid()}-{n}", limit_bytes))
            for n in arm.ids
        ]

        def node(n: str, group: MemoryCgroup, *flags: str) -> None:
            argv = ("node", "--id", n, "--executor", name, *flags, *url)
            program = tuple(group.command(hecate_command()))
            supervisor.start(ProcessSpec(n, argv, program=program))

        started = time.monotonic()
        first = arm.ids[0]
        node(first, arm.groups[0], "--capacity-layers", str(layers))
        deadline = time.monotonic() + 120
        while not _logged(supervisor, first, REFUSED) and time.monotonic() < deadline:
            if not supervisor.alive(first):
                break
            time.sleep(0.5)
        if refusals := _logged(supervisor, first, REFUSED):
            arm.refused = str(refusals[0]["refused"])
        for n, group in zip(arm.ids[1:], arm.groups[1:], strict=True):
            node(n, group)
        try:
            _serving(server.url, name, load_timeout_s)
            arm.load_s = time.monotonic() - started
            arm.url = server.url
        except (RuntimeError, TimeoutError, OSError) as exc:
            arm.failed = str(exc)[:500]
        yield arm


class Pooled(msgspec.Struct, frozen=True, kw_only=True):
    """One model's pooled run: HECATE's split and llama.cpp's RPC split standing at
    once, each in its own memory limits, timed in alternating rounds, with the ratios of
    their tokens/s by users, each round's."""

    model: str
    hecate: HecateSplit
    llama_cpp: RpcSplit
    #: HECATE's tokens/s over llama.cpp's in the same round, by users
    ratio: dict[str, list[float]]
    #: by users: whether the ratio's interval lies above :data:`SPEED`, below, or spans it
    speed_met: dict[str, Verdict]
    #: met, not met, or undecided where only a ratio's interval spans its target
    met: Verdict
    verdict: str


#: by model: (HECATE's node limit, llama.cpp's server limit). The 1B shape in 1.5 GiB
#: each, both; the 8B in 2 GiB for llama.cpp's servers, but HECATE's nodes would take
#: 11 of them there (a node's footprint fits 3 of its 32 blocks), so its nodes get what
#: three need: 4 GiB (11 blocks each).
LIMITS = {"llama-1b": (3 * 2**29, 3 * 2**29), "llama-8b": (4 * 2**30, 2 * 2**30)}
#: the speed asked of HECATE's split over llama.cpp's, by users
SPEED = {"1": 1.0, "4": 1.5}


def pooled(name: str, file: Path, *, max_tokens: int, rounds: int = 3) -> Pooled:
    """HECATE's split of ``file`` over 3 nodes and llama.cpp's over 3 servers (limits
    :data:`LIMITS`), both standing, timed at 1 and 4 users in ``rounds`` rounds, the
    arms' order alternating; the verdict against :data:`SPEED` is met only where every
    answer equals one unconstrained process's, no node met the OOM killer, both ran in
    the same limits and each ratio's interval lies above its target."""
    ours, theirs = LIMITS[name]
    rates: dict[str, dict[str, list[float]]] = {"hecate": {}, "llama.cpp": {}}
    ratio: dict[str, list[float]] = {}
    with (
        hecate_standing(file, name, 3, ours, max_tokens=max_tokens) as hecate,
        rpc_standing(file, 3, theirs, max_tokens=max_tokens) as cpp,
    ):
        arms: dict[str, HecateArm | RpcArm] = {"hecate": hecate, "llama.cpp": cpp}
        serving = hecate.url is not None and cpp.server is not None
        try:
            for r in range(rounds if serving else 0):
                for users in SPEED:
                    got: dict[str, float] = {}
                    for arm in sorted(arms, reverse=r % 2 == 1):
                        got[arm] = arms[arm].rate(int(users), max_tokens)
                        rates[arm].setdefault(users, []).append(got[arm])
                    ratio.setdefault(users, []).append(round(got["hecate"] / got["llama.cpp"], 3))
        except (RuntimeError, OSError):
            pass  # the arm that failed says why
        ours_run, cpp_run = hecate.result(rates["hecate"]), cpp.result(rates["llama.cpp"])
    speed_met = {
        users: median_interval(ratio[users]).verdict_at_least(want) if users in ratio else False
        for users, want in SPEED.items()
    }
    problems: list[str] = []
    if ours_run.skipped or cpp_run.skipped:
        problems.append(f"skipped: {ours_run.skipped or cpp_run.skipped}")
    if ours_run.failed or cpp_run.failed:
        problems.append(f"failed: {ours_run.failed or cpp_run.failed}")
    if ours_run.answers_equal is not True:
        problems.append("answers differ from one process's")
    if any(u.oom_killed for u in ours_run.node_use):
        problems.append("a node was OOM-killed")
    if ours != theirs:
        problems.append(f"HECATE's nodes needed {ours / 2**30:.1f} GiB, not {theirs / 2**30:.1f}")
    for users, reached in speed_met.items():
        if reached is not True:
            median = statistics.median(ratio[users]) if ratio.get(users) else 0.0
            word = "undecided at" if reached == "undecided" else "below"
            problems.append(f"{median:.2f}× at {users} users ({word} {SPEED[users]}×)")
    undecided = [u for u, reached in speed_met.items() if reached == "undecided"]
    met: Verdict = not problems or ("undecided" if len(problems) == len(undecided) else False)
    said = {True: "met", False: "not met", "undecided": "undecided"}[met]
    verdict = said + (": " + "; ".join(problems) if problems else "")
    return Pooled(
        model=name,
        hecate=ours_run,
        llama_cpp=cpp_run,
        ratio=ratio,
        speed_met=speed_met,
        met=met,
        verdict=verdict,
    )
