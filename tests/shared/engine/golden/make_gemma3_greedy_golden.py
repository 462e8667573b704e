"""Writes llama.cpp's greedy answers on Gemma 3 270M, the built-in ``gemma3-270m``, for
tests/shared/engine/test_gemma3_model.py: ``gemma3-270m-llama-cpp.json`` (each prompt's
ids, llama.cpp's greedy ids and each step's margin) and ``.npz`` (each prompt's step-0
logits in float16).

The prompts: a chat in Gemma's turns, and a text of about 900 tokens, past the 512
positions its sliding layers attend to, so that the window is crossed both in the
prompt and in every step after it. llama.cpp runs on its plain CPU kernels (its
repacked ones crash this build on this machine's AMX).

Run by hand, with the model pulled and the ``bench`` extra installed::

    .venv/bin/hecate model pull gemma3-270m
    .venv/bin/python tests/shared/engine/golden/make_gemma3_greedy_golden.py
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np
from tests.shared.engine.golden.make_requantized_golden import _plain_kernels

from hecate.llm.store import MODELS, pull

MODEL = "gemma3-270m"
HERE = Path(__file__).resolve().parent
STEPS = 24
CHAT = "<start_of_turn>user\nWrite a short poem about the sea.<end_of_turn>\n<start_of_turn>model\n"
#: about 900 tokens: numbered sentences, each its own, then a question on the first
LONG = (
    " ".join(
        f"Fact {i}: the {c} house on street {i * 7 % 31} has {i % 5 + 2} windows."
        for i, c in zip(range(1, 61), ["red", "blue", "green", "white", "old"] * 12, strict=True)
    )
    + " Question: how many windows has the red house on street 7? Answer:"
)
PROMPTS = {"chat": CHAT, "long": LONG}


def main() -> None:
    llama: Any = importlib.import_module("llama_cpp")
    _plain_kernels()
    path = pull(MODEL)
    llm = llama.Llama(model_path=str(path), n_threads=2, n_ctx=2048, logits_all=True, verbose=False)
    cases: dict[str, Any] = {}
    logits0: dict[str, Any] = {}
    for name, text in PROMPTS.items():
        llm.reset()
        ids = llm.tokenize(text.encode(), add_bos=True, special=True)
        llm.eval(ids)
        logits = np.asarray(llm.scores[len(ids) - 1], np.float32).copy()
        logits0[name] = logits.astype(np.float16)
        greedy, margins = [], []
        for _ in range(STEPS):
            top2 = np.partition(logits, -2)[-2:]
            token = int(np.argmax(logits))
            greedy.append(token)
            margins.append(float(top2[1] - top2[0]))
            llm.eval([token])
            logits = np.asarray(llm.scores[llm.n_tokens - 1], np.float32).copy()
        text_out = llm.detokenize(greedy).decode(errors="replace")
        cases[name] = {"prompt": ids, "greedy": greedy, "margins": margins, "text": text_out}
        print(f"{name}: {len(ids)} prompt ids; {text_out!r}")
    golden = {
        "model": MODEL,
        "sha256": MODELS[MODEL].sha256,
        "llama_cpp_python": llama.__version__,
        "repacked": False,
        "cases": cases,
    }
    (HERE / "gemma3-270m-llama-cpp.json").write_text(json.dumps(golden, indent=1) + "\n")
    np.savez_compressed(HERE / "gemma3-270m-llama-cpp.npz", **logits0)


if __name__ == "__main__":
    main()
