"""Writes llama.cpp's reference for the numpy model's check (tests/shared/engine/test_golden.py):
``smollm2-135m-llama-cpp.json`` (each prompt's token ids, llama.cpp's greedy tokens and
the margin of each choice, the versions) and ``smollm2-135m-llama-cpp.npz`` (each
prompt's full step-0 logits, float16).

Run by hand, on a machine with the model pulled and the ``bench`` extra installed (it
builds llama-cpp-python from PyPI's source with the machine's compiler)::

    .venv/bin/pip install -e './devtools[bench]'
    .venv/bin/python tests/shared/engine/golden/make_golden.py

llama.cpp is fed the token ids our tokenizer gives (so the check compares the models,
not the tokenizers; llama.cpp's own tokenization is stored beside them and compared on
its own), evaluates the prompt in one batch, then one token per step, and picks the
argmax of the last position's logits: greedy, no sampler.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from hecate.llm.store import pull
from hecate.llm.tokenizer import chat_prompt, load_tokenizer

MODEL = "smollm2-135m"
HERE = Path(__file__).resolve().parent
JSON = HERE / "smollm2-135m-llama-cpp.json"
NPZ = HERE / "smollm2-135m-llama-cpp.npz"
STEPS = 16
PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    chat_prompt([("user", "What is the capital of France?")]),
)


def _margin(logits: np.ndarray) -> float:
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])


def main() -> None:
    llama = importlib.import_module("llama_cpp")
    path = pull(MODEL, progress=print)
    tok = load_tokenizer(path)
    # logits_all: llama-cpp-python keeps a step's logits (``scores``) only then.
    llm: Any = llama.Llama(
        model_path=str(path),
        n_threads=2,
        n_threads_batch=2,
        n_ctx=128,
        logits_all=True,
        verbose=False,
    )
    prompts: list[dict[str, Any]] = []
    step0: list[np.ndarray] = []
    for text in PROMPTS:
        ids = tok.encode(text).ids
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        step0.append(logits)
        tokens, margins = [], []
        for _ in range(STEPS):
            token = int(np.argmax(logits))
            tokens.append(token)
            margins.append(round(_margin(logits), 4))
            llm.eval([token])
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        theirs = llm.tokenize(text.encode(), add_bos=False, special=True)
        prompts.append(
            {
                "text": text,
                "prompt_ids": ids,
                "llama_cpp_prompt_ids": [int(t) for t in theirs],
                "tokens": tokens,
                "margins": margins,
            }
        )
    info = llama.llama_print_system_info()
    doc = {
        "produced_by": "tests/shared/engine/golden/make_golden.py",
        "llama_cpp_python": llama.__version__,
        "llama_cpp_system_info": (info.decode() if isinstance(info, bytes) else info).strip(),
        "gguf": path.name,
        "gguf_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "steps": STEPS,
        "prompts": prompts,
    }
    JSON.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    np.savez_compressed(NPZ, step0_logits=np.stack(step0).astype(np.float16))
    print(f"wrote {JSON} and {NPZ} ({NPZ.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
