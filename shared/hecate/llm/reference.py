"""Greedy generation in one process: the text the swarm must reproduce token for token
(each token decoded on its own and joined, as the router streams them; it stops at the
end-of-turn token)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hecate.llm.gguf_model import load_stage, model_config
from hecate.llm.llama import LlamaStage
from hecate.llm.tokenizer import load_tokenizer

EOS = 2  # <|im_end|>


def greedy_text(path: Path, prompt: str, max_tokens: int) -> str:
    stage = LlamaStage(load_stage(path, 0, model_config(path).layers))
    tok = load_tokenizer(path)
    cache = stage.new_cache()
    hidden = stage.forward(stage.embed(tok.encode(prompt).ids), cache)
    out: list[str] = []
    for _ in range(max_tokens):
        token = int(np.argmax(stage.logits(hidden)))
        if token == EOS:
            break
        out.append(tok.decode([token]))
        hidden = stage.forward(stage.embed([token]), cache)
    return "".join(out)
