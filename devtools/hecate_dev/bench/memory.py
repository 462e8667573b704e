"""``hecate bench memory``: is a node's range of weights resident once?

For SmolLM2 (the real file) and synthetic files of the Llama-3.2-1B and Llama-3.1-8B
shapes (:data:`SHAPES`, made once into ``build/bench/models/`` by
:func:`hecate_dev.synthetic_gguf.write`; ``--quick``: SmolLM2 and the 1B), and for each
range of its blocks (the whole model, and each third; the 8B in thirds only: whole, one
engine process would need about 9 GB), a fresh process builds the engine's stage
(``OnnxStage(path, a, b, threads=2, slots=4, spin=False)``) and reports:

* the range's share of the file (``onnx_load.stage_bytes``),
* resident memory above the process's own before building (``VmRSS``), and the peak
  while building (``VmHWM`` above the same base), each as a multiple of the share,
* the seconds the build took,
* its memory cgroup's peak (``memory.max_usage_in_bytes``) and, once built, the
  group's anonymous memory and page cache: the group counts the mapped file's pages
  too, those the process read (the file is dropped from the page cache before each
  range, so each range's group reads it afresh).

Beside each model, llama.cpp's ``llama-server`` on the whole file with ``--load-mode
none`` (:func:`hecate_dev.bench.pooled.resident`). The target, per model: every range
resident within ``1.15 × share + KV + 200 MiB`` (KV: none, no session is open at the
measure) and its peak within 1.25 times that; the verdict says met or not met, with the
figures. ``--pooled``: the pooled run of the 1B shape (and the 8B without ``--quick``):
HECATE over 3 node processes and llama.cpp's own RPC split over 3 servers, each in a
memory cgroup, at 1 and 4 users (:func:`hecate_dev.bench.pooled_swarm.pooled`).
``--speed``: the engine's decode and prefill beside llama-bench's at each model
(:mod:`hecate_dev.bench.at_size`).

The table goes to stderr; the figures are the suite's JSON.
"""

# ruff: noqa: RUF001, RUF002, RUF003

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from subprocess import PIPE
from typing import Any

import msgspec
from gguf import GGMLQuantizationType as Q

from hecate_dev.bench import at_size, pooled, pooled_swarm
from hecate_dev.bench.results import Result
from hecate_dev.cgroups import MemoryCgroup, available
from hecate_dev.synthetic_gguf import Shape, write

MIB = 2**20
#: where the synthetic files are made, once (relative to the working folder)
MODELS = Path("build/bench/models")
SMOLLM2 = "smollm2-135m"
#: ``resident ≤ FACTOR × share + KV + SLACK_MIB``; ``peak ≤ PEAK_FACTOR ×`` that
FACTOR, SLACK_MIB, PEAK_FACTOR = 1.15, 200.0, 1.25
TARGET = (
    f"resident ≤ {FACTOR} × share + KV + {SLACK_MIB:.0f} MiB, peak ≤ {PEAK_FACTOR} × that "
    "(KV 0: no session open at the measure)"
)
#: the stage as a node builds it here
THREADS, SLOTS = 2, 4


#: As /opt/models/{1b,8b}.gguf were made (Q4_K blocks, seed 0, SmolLM2's tokenizer).
_LLAMA3 = Shape(heads=32, kv_heads=8, context=8192, rope_base=500000.0)
SHAPES = {
    "llama-1b": replace(_LLAMA3, layers=16, hidden=2048, ffn=8192, tied=True),
    "llama-8b": replace(_LLAMA3, layers=32, hidden=4096, ffn=14336, tied=False),
}


def synthetic(name: str, tokenizer: Path, folder: Path = MODELS) -> Path:
    """``folder/NAME.gguf`` of the shape :data:`SHAPES` names, made if missing (written
    beside and renamed, so that a run cut short leaves no half file)."""
    path = folder / f"{name}.gguf"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(".gguf.part")
    _say(f"writing {path} ({name} shape, Q4_K) ...")
    started = time.monotonic()
    write(part, Q.Q4_K, SHAPES[name], 0, tokenizer=tokenizer)
    part.rename(path)
    _say(f"wrote {path} in {time.monotonic() - started:.0f}s")
    return path


def _say(line: str) -> None:
    print(f"hecate bench memory: {line}", file=sys.stderr, flush=True)


# -- one range, in a process of its own ---------------------------------------------------


def _status() -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of this process, KiB."""
    fields = (line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {k: int(v.split()[0]) for k, v in fields if k in ("VmRSS", "VmHWM")}


def _child() -> None:
    """In the range's process: build the stage, print its figures as one JSON line, then
    hold it until stdin closes (the parent reads the cgroup meanwhile)."""
    from hecate.llm.gguf_file import GGUFFile
    from hecate.llm.gguf_model import read_config
    from hecate.llm.onnx_load import stage_bytes
    from hecate.llm.onnx_stage import OnnxStage

    path, a, b = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    file = GGUFFile(path)
    share = stage_bytes(file, read_config(file), a, b)
    del file
    base = _status()["VmRSS"]
    started = time.perf_counter()
    stage = OnnxStage(path, a, b, threads=THREADS, slots=SLOTS, spin=False)
    load_s = time.perf_counter() - started
    now = _status()
    out = {
        "share": share,
        "base_kib": base,
        "resident_kib": now["VmRSS"] - base,
        "peak_kib": now["VmHWM"] - base,
        "load_s": load_s,
        "pieces": len(stage.pieces),
    }
    print(json.dumps(out), flush=True)
    sys.stdin.read()


class RangeMemory(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One range's stage, built in a process of its own (MiB; ``_x``: over the share)."""

    start: int
    end: int
    share_mib: float
    target_mib: float
    resident_mib: float | None = None
    resident_x: float | None = None
    peak_mib: float | None = None
    peak_x: float | None = None
    load_s: float | None = None
    pieces: int | None = None
    base_mib: float | None = None
    cgroup_limit_mib: float | None = None
    cgroup_max_mib: float | None = None
    #: the group's anonymous memory and page cache once built
    cgroup_rss_mib: float | None = None
    cgroup_cache_mib: float | None = None
    oom_killed: bool = False
    failed: str | None = None

    @property
    def met(self) -> bool:
        return (
            self.resident_mib is not None
            and self.peak_mib is not None
            and self.resident_mib <= self.target_mib
            and self.peak_mib <= PEAK_FACTOR * self.target_mib
        )


def _evict(path: Path) -> None:
    """Drop ``path``'s pages from the page cache (those no process maps), so that the
    next group reads, and is charged for, the pages it maps."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def measure(path: Path, a: int, b: int, share: int, label: str) -> RangeMemory:
    """The stage of blocks ``[a, b)`` of ``path`` built in a fresh process, inside a
    memory cgroup of a generous limit (4 × the share + 1 GiB) where cgroups work."""
    share_mib = share / MIB
    target = FACTOR * share_mib + SLACK_MIB
    limit = 4 * share + 2**30
    group = MemoryCgroup(f"{label}-{a}-{b}-{os.getpid()}", limit) if available() else None
    code = "from hecate_dev.bench.memory import _child; _child()"
    cmd = [sys.executable, "-c", code, str(path), str(a), str(b)]
    _evict(path)
    fields: dict[str, object] = {}
    with tempfile.TemporaryFile() as err, group or contextlib.nullcontext():
        kw: dict[str, Any] = {"stdin": PIPE, "stdout": PIPE, "stderr": err}
        child = group.popen(cmd, **kw) if group else subprocess.Popen(cmd, **kw)
        line = child.stdout.readline() if child.stdout else b""
        use = group.use() if group else None  # the stage held, or its process gone
        child.communicate()  # stdin closed: the child ends
        if use is not None and group is not None:
            fields.update(
                cgroup_limit_mib=round(limit / MIB),
                cgroup_max_mib=round(group.max_usage_bytes / MIB),
                cgroup_rss_mib=round(use.rss / MIB),
                cgroup_cache_mib=round(use.cache / MIB),
                oom_killed=group.oom_killed,
            )
        if not line:
            err.seek(0)
            tail = err.read().decode(errors="replace").strip().splitlines()[-3:]
            fields["failed"] = f"exit {child.returncode}: {' | '.join(tail)}"[:500]
    if line:
        got = json.loads(line)
        resident, peak = got["resident_kib"] / 1024, got["peak_kib"] / 1024
        fields.update(
            resident_mib=round(resident),
            resident_x=round(resident / share_mib, 2),
            peak_mib=round(peak),
            peak_x=round(peak / share_mib, 2),
            load_s=round(got["load_s"], 1),
            pieces=got["pieces"],
            base_mib=round(got["base_kib"] / 1024),
        )
    return msgspec.convert(
        {"start": a, "end": b, "share_mib": round(share_mib), "target_mib": round(target)} | fields,
        RangeMemory,
    )


# -- a model, the suite ---------------------------------------------------------------------


class LlamaCppMemory(pooled.Resident, frozen=True, kw_only=True, omit_defaults=True):
    """llama.cpp on the whole file, beside the file's size and its KV (float16, the
    context it was given)."""

    file_mib: float = 0.0
    kv_mib: float = 0.0
    resident_x: float | None = None


class ModelMemory(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    file: str
    layers: int
    file_mib: float
    ranges: list[RangeMemory]
    llama_cpp: LlamaCppMemory
    met: bool
    verdict: str


class MemoryResult(Result, frozen=True, kw_only=True, omit_defaults=True):
    target: str
    threads: int
    slots: int
    #: empty when cgroups work here, else why not (the cgroup columns are then empty)
    cgroups: str
    models: list[ModelMemory]
    pooled: list[pooled_swarm.Pooled]
    speed: list[at_size.SpeedAtSize]
    table: list[str]


def ranges(layers: int, whole: bool = True) -> list[tuple[int, int]]:
    """The whole model (unless not ``whole``) and each third of its blocks."""
    n = layers
    thirds = [(0, n // 3), (n // 3, 2 * n // 3), (2 * n // 3, n)]
    return ([(0, n)] if whole else []) + thirds


def _verdict(ranges: list[RangeMemory]) -> tuple[bool, str]:
    if not ranges or any(r.failed for r in ranges):
        failed = next((r for r in ranges if r.failed), None)
        why = f"[{failed.start},{failed.end}) failed" if failed else "no range measured"
        return False, f"not met ({why})"
    met = all(r.met for r in ranges)
    worst = max(ranges, key=lambda r: (r.resident_mib or 0) / r.target_mib)
    peak = max(ranges, key=lambda r: (r.peak_mib or 0) / r.target_mib)
    return met, (
        f"{'met' if met else 'not met'}: resident {min(r.resident_x or 0 for r in ranges):.2f}"
        f"-{max(r.resident_x or 0 for r in ranges):.2f}× share; worst [{worst.start},"
        f"{worst.end}) {worst.resident_mib:.0f} MiB against {worst.target_mib:.0f} MiB, peak "
        f"[{peak.start},{peak.end}) {peak.peak_mib:.0f} MiB against "
        f"{PEAK_FACTOR * peak.target_mib:.0f} MiB"
    )


def model(name: str, path: Path, *, whole: bool = True) -> ModelMemory:
    from hecate.llm.gguf_file import GGUFFile
    from hecate.llm.gguf_model import read_config
    from hecate.llm.onnx_load import stage_bytes
    from hecate.llm.sessions import kv_bytes_per_position

    file = GGUFFile(path)
    c = read_config(file)
    shares = {(a, b): stage_bytes(file, c, a, b) for a, b in ranges(c.layers, whole)}
    del file
    measured = []
    for (a, b), share in shares.items():
        _say(f"{name} [{a},{b}) ...")
        measured.append(measure(path, a, b, share, name))
    _say(f"{name}: llama.cpp on the whole file ...")
    size = path.stat().st_size / MIB
    context = 4096
    kv = context * kv_bytes_per_position(c, c.layers, 2) / MIB  # llama.cpp's float16
    ran = pooled.resident(path, context=context, threads=THREADS, name=name)
    cpp = msgspec.convert(
        msgspec.to_builtins(ran)
        | {
            "file_mib": round(size),
            "kv_mib": round(kv),
            "resident_x": round(ran.resident_mib / size, 2) if ran.resident_mib else None,
        },
        LlamaCppMemory,
    )
    met, verdict = _verdict(measured)
    return ModelMemory(
        model=name,
        file=str(path),
        layers=c.layers,
        file_mib=round(size),
        ranges=measured,
        llama_cpp=cpp,
        met=met,
        verdict=verdict,
    )


def _cell(value: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def table(models: list[ModelMemory], runs: list[pooled_swarm.Pooled]) -> list[str]:
    head = (
        f"{'model':<10} {'range':<8} {'share':>6} {'resident':>8} {'×sh':>5} {'peak':>6} "
        f"{'×sh':>5} {'cg max':>6} {'cg rss':>6} {'cg cache':>8} {'s':>6}"
    )
    lines = [f"target: {TARGET}", "MiB; cg: the range's memory cgroup", head]
    for m in models:
        for r in m.ranges:
            lines.append(
                f"{m.model:<10} {f'[{r.start},{r.end})':<8} {r.share_mib:>6.0f} "
                f"{_cell(r.resident_mib):>8} {_cell(r.resident_x, '{:.2f}'):>5} "
                f"{_cell(r.peak_mib):>6} {_cell(r.peak_x, '{:.2f}'):>5} "
                f"{_cell(r.cgroup_max_mib):>6} {_cell(r.cgroup_rss_mib):>6} "
                f"{_cell(r.cgroup_cache_mib):>8} {_cell(r.load_s, '{:.1f}'):>6}"
                + (" OOM-killed" if r.oom_killed else "")
                + (f" FAILED {r.failed}" if r.failed else "")
            )
        cpp = m.llama_cpp
        why = cpp.skipped or cpp.failed
        lines.append(
            f"{m.model:<10} {'llama.cpp':<8} {m.file_mib:>6.0f} {_cell(cpp.resident_mib):>8} "
            f"{_cell(cpp.resident_x, '{:.2f}'):>5} {_cell(cpp.peak_mib):>6} {'':>5} "
            f"{_cell(cpp.cgroup_max_mib):>6} {'':>6} {'':>8} {_cell(cpp.load_s, '{:.1f}'):>6}"
            + (f" ({why})" if why else f" (whole file, {cpp.args}; KV {cpp.kv_mib:.0f})")
        )
        lines.append(f"{m.model}: {m.verdict}")
    for run in runs:
        lines += [run.hecate.summary(), run.llama_cpp.summary()]
        ratios = ", ".join(
            f"{'/'.join(f'{x:.2f}' for x in v)}× at {k}" for k, v in run.ratio.items()
        )
        lines.append(f"{run.model} pooled: HECATE/llama.cpp {ratios or '-'}; {run.verdict}")
    return lines


def _speed_line(s: at_size.SpeedAtSize) -> str:
    if s.skipped or s.failed:
        return f"{s.model} speed: {s.skipped or s.failed}"
    return (
        f"{s.model} speed, engine over llama-bench by round: tg128 {s.tg_ratio} "
        f"({s.tg_met}), pp512 {s.pp_ratio} ({s.pp_met}); same tokens: {s.same_tokens}"
    )


def run(*, quick: bool, pooled_runs: bool = False, speed: bool = False) -> MemoryResult:
    """``hecate bench memory``."""
    from hecate.llm.store import pull

    tokenizer = pull(SMOLLM2, progress=lambda line: _say(line))
    names = ["llama-1b"] if quick else ["llama-1b", "llama-8b"]
    files = {"smollm2": tokenizer} | {n: synthetic(n, tokenizer) for n in names}
    ok = available()
    if not ok:
        _say(f"no cgroups: {ok.reason}")
    models = [model(n, p, whole=n != "llama-8b") for n, p in files.items()]
    runs: list[pooled_swarm.Pooled] = []
    if pooled_runs:
        for n in names:
            _say(f"{n}: pooled over 3 nodes, then llama.cpp's rpc split over 3 servers ...")
            tokens = 32 if n == "llama-8b" else 64
            runs.append(pooled_swarm.pooled(n, files[n], max_tokens=tokens))
    speeds = []
    if speed:
        for n, p in files.items():
            _say(f"{n}: the engine beside llama-bench, pp512 and tg128 ...")
            speeds.append(at_size.speed(n, p, rounds=3))
    lines = table(models, runs) + [_speed_line(s) for s in speeds]
    for line in lines:
        print(line, file=sys.stderr)
    return MemoryResult(
        target=TARGET,
        threads=THREADS,
        slots=SLOTS,
        cgroups="" if ok else ok.reason,
        models=models,
        pooled=runs,
        speed=speeds,
        table=lines,
    )
