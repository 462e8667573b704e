"""Writes llama.cpp's reference for the long-prompt check (tests/system/test_long_prompt.py):
``smollm2-135m-long-prompts.json``: for prompts of about 600, 2,000 and 4,000 tokens,
the token ids our tokenizer gives, llama.cpp's greedy tokens for a few steps and the
margin of each choice (top-1 minus top-2 logit).

Run by hand, on a machine with the model pulled and the ``bench`` extra installed::

    .venv/bin/pip install -e './devtools[bench]'
    .venv/bin/python tests/shared/engine/golden/make_long_golden.py

llama.cpp is fed our token ids (the check compares the models, not the tokenizers) and
evaluates each prompt in batches of 512, then one token per step, greedy.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from hecate.llm.store import pull
from hecate.llm.tokenizer import load_tokenizer

MODEL = "smollm2-135m"
HERE = Path(__file__).resolve().parent
JSON = HERE / "smollm2-135m-long-prompts.json"
STEPS = 8
SIZES = (600, 2000, 4000)
COLOURS = ("red", "green", "blue", "yellow", "white", "black", "grey")
THINGS = ("boat", "house", "bridge", "tower", "garden", "river", "market", "train")
PLACES = ("Lisbon", "Oslo", "Kyoto", "Lima", "Cairo", "Quebec", "Perth", "Tunis")


def prompt(tokens: int, count: Any) -> str:
    """A numbered list of short varied sentences, cut to about ``tokens`` tokens."""
    lines = ["Here is a long list of notes from a travel diary.", ""]
    i = 0
    while True:
        i += 1
        line = (
            f"{i}. In {PLACES[i % len(PLACES)]} I saw a {COLOURS[i % len(COLOURS)]} "
            f"{THINGS[(i * 3) % len(THINGS)]} near the old station."
        )
        if count("\n".join([*lines, line])) > tokens:
            return "\n".join(lines) + f"\n{i}."
        lines.append(line)


def _margin(logits: np.ndarray) -> float:
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])


def main() -> None:
    llama = importlib.import_module("llama_cpp")
    path = pull(MODEL, progress=print)
    tok = load_tokenizer(path)
    llm: Any = llama.Llama(
        model_path=str(path),
        n_threads=2,
        n_threads_batch=2,
        n_ctx=4608,
        n_batch=512,
        logits_all=True,
        verbose=False,
    )
    prompts: list[dict[str, Any]] = []
    for size in SIZES:
        text = prompt(size, lambda s: len(tok.encode(s).ids))
        ids = tok.encode(text).ids
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        tokens, margins = [], []
        for _ in range(STEPS):
            token = int(np.argmax(logits))
            tokens.append(token)
            margins.append(round(_margin(logits), 4))
            llm.eval([token])
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        prompts.append({"text": text, "prompt_ids": ids, "tokens": tokens, "margins": margins})
        print(size, len(ids), tok.decode(tokens), margins)
    info = llama.llama_print_system_info()
    doc = {
        "produced_by": "tests/shared/engine/golden/make_long_golden.py",
        "llama_cpp_python": llama.__version__,
        "llama_cpp_system_info": (info.decode() if isinstance(info, bytes) else info).strip(),
        "gguf": path.name,
        "gguf_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "steps": STEPS,
        "prompts": prompts,
    }
    JSON.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {JSON}")


if __name__ == "__main__":
    main()
