"""The engine's speed at real sizes beside ``llama-bench`` on the same file and threads:
decode (``tg128``: 128 tokens generated one at a time) and prefill (``pp512``: a
512-token prompt), for SmolLM2 and the 1B and 8B shapes, in interleaved rounds.

Each round runs, in an order that alternates from round to round, ``llama-bench -p 512
-n 128 -r 1 -t THREADS --repack 0`` (``--repack 0``: the repacked kernels crash this
build on this machine, as ``llama-server`` does without ``-nr``) and the engine in a
process of its own holding the whole model (``OnnxStage(path, 0, layers,
threads=THREADS)``, 1 slot): the 512-token prompt in the chunks a node runs
(:data:`hecate.llm.chunks.PREFILL_CHUNK`), then 128 greedy decode steps. A round's
ratio is the engine's tokens/s over llama-bench's in that round. The engine's tokens
are checked: every round must give the same 128, since one process on one file is
deterministic.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec

from hecate_dev.bench.interval import Verdict, median_interval
from hecate_dev.bench.pooled import binary

PROMPT_TOKENS, GEN_TOKENS = 512, 128

#: the engine's side of a round, in a process of its own: prints its figures as JSON
_ENGINE = """
import json, sys, time
import numpy as np
from hecate.llm.onnx_stage import OnnxStage
from hecate.llm.gguf_model import model_config
from hecate.llm.chunks import PREFILL_CHUNK
from pathlib import Path
path, threads, pp, tg = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
c = model_config(path)
stage = OnnxStage(path, 0, c.layers, threads=threads, slots=1, capacity=pp + tg + 8)
prompt = [(7 * i + 11) % c.vocab for i in range(pp)]
def prefill():
    cache = stage.new_cache()
    t0 = time.perf_counter()
    for a in range(0, pp, PREFILL_CHUNK):
        out = stage.forward_batch([stage.embed(prompt[a:a + PREFILL_CHUNK])], [cache])
    return cache, out, time.perf_counter() - t0
cache, _, _ = prefill()  # warm up, as llama-bench does
stage.free(cache)
cache, out, pp_s = prefill()
stage.free(cache)
cache = stage.new_cache()
token = int(np.argmax(stage.logits_of(stage.forward_batch([stage.embed([1])], [cache]))[0]))
tokens = []
t0 = time.perf_counter()
for _ in range(tg):
    out = stage.forward_batch([stage.embed([token])], [cache])
    token = int(np.argmax(stage.logits_of(out)[0]))
    tokens.append(token)
tg_s = time.perf_counter() - t0
print(json.dumps({"pp": pp / pp_s, "tg": tg / tg_s, "tokens": tokens}))
"""


class SpeedAtSize(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One model's rounds: tokens/s of each side (by round) and their ratios."""

    model: str
    threads: int
    rounds: int
    #: tokens/s by round: the engine's and llama-bench's, decode (tg) and prefill (pp)
    engine_tg: list[float] = []
    llama_tg: list[float] = []
    engine_pp: list[float] = []
    llama_pp: list[float] = []
    tg_ratio: list[float] = []
    pp_ratio: list[float] = []
    tg_met: Verdict = False
    pp_met: Verdict = False
    #: every round's engine gave the same tokens
    same_tokens: bool | None = None
    skipped: str | None = None
    failed: str | None = None


def _llama_bench(exe: Path, file: Path, threads: int) -> tuple[float, float]:
    """llama-bench's (pp512, tg128) tokens/s, one repetition."""
    argv = [str(exe), "-m", str(file), "-t", str(threads), "-p", str(PROMPT_TOKENS)]
    argv += ["-n", str(GEN_TOKENS), "-r", "1", "--repack", "0", "-o", "json"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=1800)
    rows = json.loads(out.stdout)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] == PROMPT_TOKENS)
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] == GEN_TOKENS)
    return float(pp), float(tg)


def _engine(file: Path, threads: int) -> dict[str, object]:
    argv = [sys.executable, "-c", _ENGINE, str(file), str(threads)]
    argv += [str(PROMPT_TOKENS), str(GEN_TOKENS)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=1800)
    figures: dict[str, object] = json.loads(out.stdout.splitlines()[-1])
    return figures


def speed(model: str, file: Path, *, threads: int = 2, rounds: int = 3) -> SpeedAtSize:
    base = SpeedAtSize(model=model, threads=threads, rounds=rounds)
    exe = binary("llama-bench")
    if exe is None:
        return msgspec.structs.replace(base, skipped="llama-bench not built")
    names = ("engine_tg", "llama_tg", "engine_pp", "llama_pp")
    sides: dict[str, list[float]] = {k: [] for k in names}
    seen: list[object] = []
    try:
        for r in range(rounds):
            for side in ("engine", "llama") if r % 2 == 0 else ("llama", "engine"):
                if side == "llama":
                    pp, tg = _llama_bench(exe, file, threads)
                else:
                    got = _engine(file, threads)
                    pp, tg = float(str(got["pp"])), float(str(got["tg"]))
                    seen.append(got["tokens"])
                sides[f"{side}_pp"].append(round(pp, 2))
                sides[f"{side}_tg"].append(round(tg, 2))
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, ValueError) as exc:
        why = getattr(exc, "stderr", "") or ""
        return msgspec.structs.replace(base, failed=f"{exc}: {str(why)[-300:]}")
    tg_ratio = [round(e / w, 3) for e, w in zip(sides["engine_tg"], sides["llama_tg"], strict=True)]
    pp_ratio = [round(e / w, 3) for e, w in zip(sides["engine_pp"], sides["llama_pp"], strict=True)]
    same = all(t == seen[0] for t in seen)
    return msgspec.structs.replace(
        base,
        **sides,
        tg_ratio=tg_ratio,
        pp_ratio=pp_ratio,
        tg_met=median_interval(tg_ratio).verdict_at_least(1.0) if same else False,
        pp_met=median_interval(pp_ratio).verdict_at_least(1.0),
        same_tokens=same,
    )
