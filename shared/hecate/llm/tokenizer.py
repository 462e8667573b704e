"""The GPT-2 style byte-level BPE tokenizer, rebuilt from the GGUF's own vocabulary.

SmolLM2's pre-tokenizer (``tokenizer.ggml.pre = smollm``) splits digits one by one
before the byte-level split. Special tokens (``<|im_start|>`` ...) are never split.
BOS is not added.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from hecate.llm.gguf_file import GGUFFile

CONTROL = 3  # GGUF token_type of control (special) tokens


def load_tokenizer(path: Path) -> Tokenizer:
    """From the prepared folder when it is there (instant), else built from the GGUF."""
    from hecate.llm.gguf_model import Prepared

    return Tokenizer.from_str(Prepared(path).text("tokenizer.json", lambda: _build(path).to_str()))


def _build(path: Path) -> Tokenizer:
    file = GGUFFile(path)
    tokens: list[str] = file.field("tokenizer.ggml.tokens")
    merges: list[tuple[str, str]] = []
    for m in file.field("tokenizer.ggml.merges"):
        left, right = m.split(" ", 1)
        merges.append((left, right))
    types = [int(t) for t in np.asarray(file.field("tokenizer.ggml.token_type"))]
    tok = Tokenizer(
        models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False)
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([t for t, kind in zip(tokens, types, strict=True) if kind == CONTROL])
    return tok


def chat_prompt(messages: list[tuple[str, str]], *, system: str | None = None) -> str:
    """SmolLM2's chat template (ChatML), ending with the assistant's turn.

    Without a system message first, the template's default one is used.
    """
    out = []
    if not messages or messages[0][0] != "system":
        out.append(f"<|im_start|>system\n{system or DEFAULT_SYSTEM}<|im_end|>\n")
    for role, content in messages:
        out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    out.append("<|im_start|>assistant\n")
    return "".join(out)


DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
