"""Writes llama.cpp's reference for the engine on SmolLM2's real weights re-quantised
into the types people download (tests/shared/engine/test_requantized_golden.py).

For each type of :data:`TYPES`, llama.cpp's own quantiser (``llama-quantize
--allow-requantize``, built from the bench extra's vendored source) turns the pulled
SmolLM2 file into that type (a ``Q4_K_M`` keeps llama.cpp's mix: ``Q5_0`` and ``Q8_0``
for the rows whose length is not a multiple of 256), and llama.cpp runs it: the prompt
in one batch, then greedy decoding, one token a step. ``requantized/<type>.json`` keeps
the prompt, llama.cpp's greedy ids and each step's margin, a SHA-256 over the file's
tensors (name, type, bytes) and each type's count of matrices; ``requantized/<type>.npz``
the step-0 logits in float16. The test makes the same file with the same quantiser and
checks the hash before it compares, so the files themselves (100 MB each) are never
committed.

Run by hand, with llama-cpp-python importable and llama.cpp's binaries built::

    .venv/bin/python tests/shared/engine/golden/make_requantized_golden.py [TYPE ...]
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from hecate.llm.gguf_file import GGUFFile
from hecate.llm.store import pull
from hecate.llm.tokenizer import load_tokenizer
from hecate_dev.bench.pooled import binary
from hecate_dev.synthetic_gguf import tensors_sha256

HERE = Path(__file__).resolve().parent / "requantized"
MODEL = "smollm2-135m"
PROMPT = "The capital of France is"
STEPS = 16
#: the types made, as llama-quantize names them: between them every type the engine
#: runs but Q4_1 (SmolLM2's own), F16 and Q2_K (Q4_K_M holds Q5_0, Q5_K_M Q5_1,
#: IQ4_XS IQ4_NL, Q3_K_M Q4_0; each mix as llama.cpp chooses it, and its Q2_K mix of
#: SmolLM2 holds Q4_0 and Q3_K alone)
TYPES = ("Q4_K_M", "Q5_K_M", "Q3_K_M", "Q2_K", "IQ4_XS", "BF16")


def requantize(source: Path, kind: str, out: Path) -> None:
    """``source`` turned into ``kind`` by llama.cpp's quantiser (2 threads)."""
    exe = binary("llama-quantize")
    if exe is None:
        raise FileNotFoundError("llama-quantize is not built")
    argv = [str(exe), "--allow-requantize", str(source), str(out), kind, "2"]
    subprocess.run(argv, check=True, capture_output=True, timeout=600)


def _plain_kernels() -> None:
    """Models loaded from now on run on llama.cpp's plain CPU kernels, not the repacked
    ones (``use_extra_bufts``): this build's repacked Q4_K and IQ4_XS kernels crash on
    an AVX-512 host."""
    low: Any = importlib.import_module("llama_cpp.llama_cpp")
    default = low.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = False
        return p

    low.llama_model_default_params = params


def _margin(logits: np.ndarray) -> float:
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])


def main(only: list[str]) -> None:
    llama = importlib.import_module("llama_cpp")
    _plain_kernels()
    source = pull(MODEL, progress=print)
    ids = load_tokenizer(source).encode(PROMPT).ids
    HERE.mkdir(exist_ok=True)
    for kind in TYPES:
        if only and kind not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{kind}.gguf"
            requantize(source, kind, path)
            llm: Any = llama.Llama(
                model_path=str(path), n_threads=2, n_ctx=128, logits_all=True, verbose=False
            )
            llm.eval(ids)
            logits = np.asarray(llm.scores[len(ids) - 1], dtype=np.float32).copy()
            step0 = logits.copy()
            greedy, margins = [], []
            for _ in range(STEPS):
                token = int(np.argmax(logits))
                greedy.append(token)
                margins.append(round(_margin(logits), 4))
                llm.eval([token])
                logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32).copy()
            types = Counter(t.tensor_type.name for t in GGUFFile(path).tensors.values())
            golden = {
                "type": kind,
                "prompt": ids,
                "greedy": greedy,
                "margins": margins,
                "tensors_sha256": tensors_sha256(path),
                "tensor_types": dict(sorted(types.items())),
                "llama_cpp_python": llama.__version__,
                "repacked": False,
            }
            del llm
        (HERE / f"{kind}.json").write_text(json.dumps(golden, indent=1) + "\n")
        np.savez_compressed(HERE / f"{kind}.npz", step0_logits=step0.astype(np.float16))
        print(f"{kind}: {dict(types)}, {sum(m > 0.5 for m in margins)}/{STEPS} sure steps")


if __name__ == "__main__":
    main(sys.argv[1:])
