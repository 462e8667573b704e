"""``hecate bench types``: the engine's decode and prefill on each weight type people
download, beside ``llama-bench`` on the same file and threads; and Gemma 3 270M.

The files: SmolLM2-135M's own (Q4_1, ``hecate model pull smollm2-135m``) re-quantised by
llama.cpp's quantiser into each type of :data:`TYPES` (``llama-quantize
--allow-requantize SRC OUT TYPE 2``), made once into :data:`FOLDER` and kept with a stamp
beside each (:func:`made`): the same source, quantiser and type, and the file of the size
it was written at, are used again. The weights are SmolLM2's rounded twice, so the
figures measure the kernels, not a type's quality. A K-quant type is llama.cpp's mix
(rows whose length is no multiple of 256 take another type), so each file's matrices are
counted by type (:func:`matrices`).

Each file is timed in rounds (:func:`timed`), each running, in an order that alternates
from round to round, the two sides of :mod:`hecate_dev.bench.at_size`: ``llama-bench -p
512 -n 128 -r 1 --repack 0`` and the engine holding the whole model in a process of its
own (the 512-token prompt in a node's chunks, then 128 greedy decode steps). A round's
ratio is the engine's tokens/s over llama-bench's in that round, and every round's
engine must give the same tokens. A ratio within a round is fair only when both sides
met the same machine, and on a shared one they may not: llama.cpp's threads wait for
each other at every step, so a process beside them that takes a core slows llama-bench
many times over and the engine far less. So each try waits for the machine to fall
quiet first, the share of the cores other processes took is measured while each side
runs (``/proc/stat`` less this process's and its children's time), and a round in which
it passed :data:`QUIET` is run again (at most :data:`RETRIES` times; the share of every
round kept is recorded).

The target (:data:`TARGET`): F16's decode at least :data:`F16_AT_LEAST` × llama-bench's,
judged on the median's interval (:mod:`hecate_dev.bench.interval`; undecided from one
round, whose interval holds the median at no confidence). The other types' ratios are
reported with their median's interval, against no target.

Gemma 3 270M (:func:`gemma_file`): the store's ``gemma3-270m`` when pulled, else
:data:`GEMMA_FILE` when there, else skipped with the reason.

The table goes to stderr; the figures are the suite's JSON.
"""

# ruff: noqa: RUF001, RUF002

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import msgspec

from hecate_dev.bench import at_size
from hecate_dev.bench.interval import Verdict, median_interval
from hecate_dev.bench.pooled import binary
from hecate_dev.bench.results import Result

MODEL = "smollm2-135m"
#: the pulled file's own type: timed as it is, not re-quantised
SOURCE_TYPE = "Q4_1"
#: as ``llama-quantize`` names them, in the report's order
TYPES = (
    "F16",
    "BF16",
    "Q8_0",
    "Q6_K",
    "Q5_K_M",
    "Q5_0",
    "Q5_1",
    "Q4_K_M",
    "Q4_0",
    "Q4_1",
    "IQ4_NL",
    "IQ4_XS",
    "Q3_K_M",
    "Q2_K",
)
#: ``--quick``: the pulled file, one quantised type and the one with a target
QUICK_TYPES = ("F16", "Q8_0", "Q4_1")
#: where the files are made, once (relative to the working folder)
FOLDER = Path("build/bench/models/types")
THREADS = 2
F16_AT_LEAST = 0.9
TARGET = f"decode (tg128) on F16 ≥ {F16_AT_LEAST}× llama-bench's, same file and threads"
#: a round is quiet when other processes took at most this share of the machine's cores
#: while either side ran; one that is not is run again, at most RETRIES times
QUIET, RETRIES = 0.05, 2
#: at most this long, before each try, for the machine to fall quiet
WAIT_S = 120.0
GEMMA = "gemma3-270m"
#: Gemma 3 270M's file where the store has none
GEMMA_FILE = Path("/tmp/gemma/gemma-3-270m-q4_k_m.gguf")


def _say(line: str) -> None:
    print(f"hecate bench types: {line}", file=sys.stderr, flush=True)


class TypeSpeed(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One file's rounds: tokens/s of each side (by round) and their ratios."""

    #: the weight type as llama-quantize names it (Gemma: its file's)
    type: str
    model: str
    file: str = ""
    file_mib: float = 0.0
    #: the file's matrices (tensors of 2 dimensions or more) by type, most first
    matrices: dict[str, int] = {}
    engine_tg: list[float] = []
    llama_tg: list[float] = []
    engine_pp: list[float] = []
    llama_pp: list[float] = []
    tg_ratio: list[float] = []
    pp_ratio: list[float] = []
    #: by round: the larger share of the machine's cores that other processes took
    #: while either side ran (0 to 1)
    others_cpu: list[float] = []
    #: rounds run again because others took more than QUIET of the cores
    rerun: int = 0
    #: seconds spent waiting for the machine to fall quiet before rounds
    waited_s: float = 0.0
    #: every round's engine gave the same tokens
    same_tokens: bool | None = None
    skipped: str | None = None
    failed: str | None = None


class TypesResult(Result, frozen=True, kw_only=True):
    model: str = MODEL
    source_type: str = SOURCE_TYPE
    threads: int = THREADS
    rounds: int = 0
    target: str = TARGET
    f16_at_least: float = F16_AT_LEAST
    quiet: float = QUIET
    retries: int = RETRIES
    types: list[TypeSpeed] = msgspec.field(default_factory=list)
    gemma: TypeSpeed | None = None
    #: F16's decode against :data:`F16_AT_LEAST` (False when its tokens differed)
    f16_met: Verdict | None = None
    table: list[str] = msgspec.field(default_factory=list)
    skipped: str | None = None


# -- the files ------------------------------------------------------------------------------


def stamp_of(source: Path, kind: str, quantizer: Path) -> dict[str, object]:
    """What a made file's stamp must say for the file to be used again."""
    return {
        "source": str(source),
        "source_bytes": source.stat().st_size,
        "type": kind,
        "quantizer": str(quantizer),
    }


def fits(stamp: dict[str, object], expected: dict[str, object], size: int) -> bool:
    """Whether a file of ``size`` bytes with ``stamp`` is the one ``expected`` describes:
    the stamp says what was asked, and the file has the size it was written at."""
    return {k: stamp.get(k) for k in expected} == expected and stamp.get("bytes") == size


def made(source: Path, kind: str, folder: Path = FOLDER) -> Path:
    """``source`` in ``kind``: ``source`` itself for its own type, else
    ``folder/smollm2-135m-KIND.gguf``, made by ``llama-quantize`` unless its stamp
    (``.json`` beside) fits (written beside and renamed, so that a run cut short leaves
    no half file). Raises ``FileNotFoundError`` without the quantiser,
    ``subprocess.CalledProcessError`` when it fails."""
    if kind == SOURCE_TYPE:
        return source
    exe = binary("llama-quantize")
    if exe is None:
        raise FileNotFoundError("llama-quantize is not built")
    out = folder / f"{MODEL}-{kind}.gguf"
    stamp = out.with_suffix(".json")
    expected = stamp_of(source, kind, exe)
    if (
        out.exists()
        and stamp.exists()
        and fits(json.loads(stamp.read_text()), expected, out.stat().st_size)
    ):
        return out
    folder.mkdir(parents=True, exist_ok=True)
    part = out.with_suffix(".gguf.part")
    _say(f"llama-quantize {source.name} -> {out} ({kind}) ...")
    argv = [str(exe), "--allow-requantize", str(source), str(part), kind, str(THREADS)]
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=900)
    part.rename(out)
    stamp.write_text(json.dumps(expected | {"bytes": out.stat().st_size}, indent=1) + "\n")
    return out


def matrices(path: Path) -> dict[str, int]:
    """``path``'s tensors of 2 dimensions or more, counted by type, most first."""
    from gguf import GGUFReader

    counts = Counter(t.tensor_type.name for t in GGUFReader(path).tensors if len(t.shape) >= 2)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def gemma_file() -> tuple[Path | None, str]:
    """Gemma 3 270M's file, or None and why not."""
    from hecate.llm.store import model_path, present

    if present(GEMMA):
        return model_path(GEMMA), ""
    if GEMMA_FILE.is_file():
        return GEMMA_FILE, ""
    return None, f"{GEMMA} is not pulled (hecate model pull {GEMMA}) and {GEMMA_FILE} is absent"


# -- a file's speed -----------------------------------------------------------------------


class Sample(msgspec.Struct, frozen=True):
    """The machine's CPU seconds so far: its cores' busy time (``/proc/stat``: user,
    nice, system, irq, softirq and steal) and this process's own and its waited-for
    children's (``os.times``), at wall time ``at``."""

    at: float
    busy: float
    ours: float


def sample() -> Sample:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    t = os.times()
    return Sample(
        at=time.monotonic(),
        busy=(user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"),
        ours=t.user + t.system + t.children_user + t.children_system,
    )


def others(before: Sample, after: Sample, cores: int) -> float:
    """The share of the machine's ``cores`` that other processes took between two
    samples (0 to 1): its busy time less this process's and its children's."""
    wall = after.at - before.at
    if wall <= 0:
        return 0.0
    theirs = (after.busy - before.busy) - (after.ours - before.ours)
    return round(min(1.0, max(0.0, theirs / (wall * cores))), 3)


def settle(cores: int, wait_s: float = WAIT_S) -> float:
    """Wait until other processes take at most :data:`QUIET` of the machine over a
    second, or ``wait_s`` has passed; the seconds waited."""
    started = time.monotonic()
    while True:
        before = sample()
        time.sleep(1.0)
        if others(before, sample(), cores) <= QUIET or time.monotonic() - started >= wait_s:
            return round(max(0.0, time.monotonic() - started - 1.0), 1)


def why(exc: Exception) -> str:
    """A side's failure: its exit status and the last line its process wrote, or its
    timeout (not the command, which holds the engine's whole script)."""
    if isinstance(exc, subprocess.CalledProcessError):
        lines = [ln.strip() for ln in str(exc.stderr or "").splitlines() if ln.strip()]
        return f"exit {exc.returncode}" + (f": {lines[-1][:300]}" if lines else "")
    if isinstance(exc, subprocess.TimeoutExpired):
        return f"timed out after {exc.timeout:.0f} s"
    return f"{type(exc).__name__}: {exc}"


class Side(msgspec.Struct, frozen=True):
    """One side's figures in a round: prefill and decode tokens/s, the engine's tokens
    (llama-bench's: none) and the share of the cores others took meanwhile."""

    pp: float
    tg: float
    tokens: list[int] | None
    others: float


def side(name: str, path: Path, cores: int) -> Side:
    """One run of ``name`` (``engine`` or ``llama``) on ``path``: llama-bench's or the
    engine's own process (:mod:`hecate_dev.bench.at_size`), watched for other load."""
    before = sample()
    if name == "llama":
        exe = binary("llama-bench")
        assert exe is not None, "run() checks llama-bench is built"
        pp, tg = at_size._llama_bench(exe, path, THREADS)
        tokens = None
    else:
        got = at_size._engine(path, THREADS)
        pp, tg = float(str(got["pp"])), float(str(got["tg"]))
        ids = got["tokens"]
        assert isinstance(ids, list), "the engine's side prints its tokens as a list"
        tokens = [int(t) for t in ids]
    return Side(round(pp, 2), round(tg, 2), tokens, others(before, sample(), cores))


def timed(kind: str, model: str, path: Path, rounds: int) -> TypeSpeed:
    """``path``'s rounds: each runs the engine and llama-bench one after the other, the
    order swapped each round, once the machine is quiet (:func:`settle`); a round in
    which other processes took more than :data:`QUIET` of the cores while either side
    ran is run again, up to :data:`RETRIES` times (the last try is kept, its share
    recorded)."""
    cores = os.cpu_count() or 1
    base = {
        "type": kind,
        "model": model,
        "file": str(path),
        "file_mib": round(path.stat().st_size / 2**20, 1),
        "matrices": matrices(path),
    }
    figures: dict[str, list[float]] = {
        k: [] for k in ("engine_tg", "llama_tg", "engine_pp", "llama_pp", "others_cpu")
    }
    seen: list[list[int] | None] = []
    rerun, waited = 0, 0.0
    try:
        for r in range(rounds):
            order = ("engine", "llama") if r % 2 == 0 else ("llama", "engine")
            for attempt in range(RETRIES + 1):
                waited += settle(cores)
                got = {name: side(name, path, cores) for name in order}
                share = max(s.others for s in got.values())
                if share <= QUIET or attempt == RETRIES:
                    break
                rerun += 1
                _say(f"{kind}: round {r + 1}: others took {share:.0%} of the cores; again")
            for name, s in got.items():
                figures[f"{name}_tg"].append(s.tg)
                figures[f"{name}_pp"].append(s.pp)
            figures["others_cpu"].append(share)
            seen.append(got["engine"].tokens)
    except (subprocess.SubprocessError, ValueError, KeyError) as exc:
        return msgspec.convert(base | {"failed": why(exc)}, TypeSpeed)

    def ratios(what: str) -> list[float]:
        pairs = zip(figures[f"engine_{what}"], figures[f"llama_{what}"], strict=True)
        return [round(e / w, 3) for e, w in pairs]

    return msgspec.convert(
        base
        | figures
        | {
            "tg_ratio": ratios("tg"),
            "pp_ratio": ratios("pp"),
            "same_tokens": all(t == seen[0] for t in seen),
            "rerun": rerun,
            "waited_s": round(waited, 1),
        },
        TypeSpeed,
    )


def verdict_at_least(ratios: list[float], target: float) -> Verdict:
    """Ratios by round against ``target`` on their median's interval; undecided from one
    round, whose interval holds the median at no confidence."""
    if len(ratios) < 2:
        return "undecided"
    return median_interval(ratios).verdict_at_least(target)


def f16_verdict(speeds: list[TypeSpeed]) -> Verdict | None:
    """F16's decode against :data:`F16_AT_LEAST` (:func:`verdict_at_least`); False when
    it failed or its engine's tokens differed between rounds; None when not timed."""
    f16 = next((s for s in speeds if s.type == "F16"), None)
    if f16 is None or f16.skipped:
        return None
    if f16.failed or not f16.tg_ratio or not f16.same_tokens:
        return False
    return verdict_at_least(f16.tg_ratio, F16_AT_LEAST)


def _figures(values: list[float]) -> str:
    return ", ".join(f"{x:.1f}" for x in values) or "-"


def _interval(ratios: list[float]) -> str:
    if len(ratios) < 2:
        return "-"
    i = median_interval(ratios)
    return f"{statistics.median(ratios):.3f} ({i.low:.3f}-{i.high:.3f} at {i.confidence:.0%})"


def table(speeds: list[TypeSpeed]) -> list[str]:
    """The console's table: a line per file and measure."""
    lines = [
        f"{'type':<12} {'what':<6} {'engine tok/s':<28} {'llama-bench tok/s':<28} ratio by round"
    ]
    for s in speeds:
        name = s.type if s.model == MODEL else f"{s.model} {s.type}"
        if s.skipped or s.failed:
            lines.append(f"{name:<12} {'':<6} {s.skipped or 'FAILED ' + str(s.failed)}")
            continue
        for what in ("tg", "pp"):
            lines.append(
                f"{name:<12} {what + ('128' if what == 'tg' else '512'):<6} "
                f"{_figures(getattr(s, f'engine_{what}')):<28} "
                f"{_figures(getattr(s, f'llama_{what}')):<28} "
                f"{', '.join(f'{x:.3f}' for x in getattr(s, f'{what}_ratio'))}"
                + (f"  median {_interval(getattr(s, f'{what}_ratio'))}")
                + ("" if what == "pp" or s.same_tokens else "  (tokens differed between rounds)")
            )
        lines.append(
            f"{name:<12} {'others':<6} {', '.join(f'{x:.0%}' for x in s.others_cpu):<28} "
            f"of the cores by round; run again: {s.rerun}, waited {s.waited_s:.0f} s"
        )
    return lines


# -- the suite ------------------------------------------------------------------------------


def run(*, quick: bool, rounds: int | None = None, if_present: bool = False) -> TypesResult:
    """``hecate bench types``: skipped, saying why, without llama.cpp's binaries or (with
    ``if_present``) without SmolLM2 pulled."""
    from hecate.llm.store import present, pull

    rounds = rounds or (1 if quick else 3)
    lacking = [b for b in ("llama-bench", "llama-quantize") if binary(b) is None]
    if lacking:
        reason = f"llama.cpp's {' and '.join(lacking)} not built (or set HECATE_LLAMA_CPP_BIN)"
        return TypesResult(rounds=rounds, skipped=reason)
    if if_present and not present(MODEL):
        return TypesResult(
            rounds=rounds, skipped=f"{MODEL} is not pulled (hecate model pull {MODEL})"
        )
    source = pull(MODEL, progress=_say)
    speeds: list[TypeSpeed] = []
    for kind in QUICK_TYPES if quick else TYPES:
        try:
            path = made(source, kind)
        except (OSError, subprocess.SubprocessError) as exc:
            said = why(exc)
            _say(f"{kind}: the quantiser failed: {said}")
            speeds.append(TypeSpeed(type=kind, model=MODEL, failed=f"llama-quantize: {said}"))
            continue
        _say(f"{kind}: the engine beside llama-bench, pp512 and tg128, {rounds} rounds ...")
        speeds.append(timed(kind, MODEL, path, rounds))
    found, reason = gemma_file()
    if found is None:
        _say(f"{GEMMA}: skipped: {reason}")
        gemma = TypeSpeed(type="-", model=GEMMA, skipped=reason)
    else:
        _say(f"{GEMMA} ({found}): the engine beside llama-bench, {rounds} rounds ...")
        gemma = timed(file_type(found), GEMMA, found, rounds)
    lines = table([*speeds, gemma])
    met = f16_verdict(speeds)
    lines.append(f"target: {TARGET}: {met}")
    for line in lines:
        print(line, file=sys.stderr)
    return TypesResult(rounds=rounds, types=speeds, gemma=gemma, f16_met=met, table=lines)


def file_type(path: Path) -> str:
    """The type a file's name says (``gemma-3-270m-q4_k_m.gguf``: Q4_K_M), else "-"."""
    kinds = r"[qQ]\d_[kK](?:_[sSmMlL])?|[qQ]\d_\d|[iI][qQ]\d_\w\w|[bB]?[fF](?:16|32)"
    m = re.search(rf"[-_.]({kinds})\.gguf$", path.name)
    return m.group(1).upper() if m else "-"
