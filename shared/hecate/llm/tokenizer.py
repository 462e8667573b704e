"""The GPT-2 style byte-level BPE tokenizer, rebuilt from the GGUF's own vocabulary.

The GGUF says which pre-tokenizer splits the text before the byte-level BPE
(``tokenizer.ggml.pre``, as llama.cpp reads it): SmolLM2's (``smollm``) splits digits one
by one before GPT-2's split; Llama 3's (``llama-bpe``) and Qwen2's (``qwen2``) split by
their own expressions (digits in threes, or one by one). Special tokens (``<|im_start|>``
...) are never split. BOS is added where the file says so (``add_bos_token``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from hecate.core.errors import HecateError
from hecate.llm.gguf_file import GGUFFile

CONTROL = 3  # GGUF token_type of control (special) tokens

#: llama.cpp's expressions for the pre-tokenizers that are not GPT-2's own
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")


def _byte_level() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _split(expression: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(expression), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


#: ``tokenizer.ggml.pre`` → the pre-tokenizer it names
PRE_TOKENIZERS = {
    "default": _byte_level,
    "gpt-2": _byte_level,
    "smollm": lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), _byte_level()]
    ),
    "llama-bpe": lambda: _split(_LLAMA3),
    "llama3": lambda: _split(_LLAMA3),
    "qwen2": lambda: _split(_QWEN2),
}


class TokenizerError(HecateError):
    """A GGUF whose tokenizer this module cannot rebuild; the message names it."""

    code = "unsupported_tokenizer"


def load_tokenizer(path: Path) -> Tokenizer:
    """From the prepared folder when it is there (instant), else built from the GGUF."""
    from hecate.llm.gguf_model import Prepared

    return Tokenizer.from_str(Prepared(path).text("tokenizer.json", lambda: _build(path).to_str()))


def _build(path: Path) -> Tokenizer:
    file = GGUFFile(path)
    kind = file.metadata.get("tokenizer.ggml.model")
    if kind == "gpt2":
        tok = _byte_level_bpe(file)
    elif kind == "llama":
        tok = _sentencepiece(file)
    else:
        raise TokenizerError(
            f"{path}: tokenizer {kind!r} is not supported (supported: 'gpt2', byte-level "
            "BPE; 'llama', SentencePiece BPE)"
        )
    tokens: list[str] = file.field("tokenizer.ggml.tokens")
    types = [int(t) for t in np.asarray(file.field("tokenizer.ggml.token_type"))]
    tok.add_special_tokens([t for t, kind in zip(tokens, types, strict=True) if kind == CONTROL])
    bos = file.metadata.get("tokenizer.ggml.bos_token_id")
    if file.metadata.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", special_tokens=[(tokens[bos], int(bos))]
        )
    return tok


def _byte_level_bpe(file: GGUFFile) -> Tokenizer:
    pre = str(file.metadata.get("tokenizer.ggml.pre", "default"))
    if pre not in PRE_TOKENIZERS:
        raise TokenizerError(
            f"{file.path}: pre-tokenizer {pre!r} is not supported (supported: "
            f"{', '.join(PRE_TOKENIZERS)})"
        )
    tokens: list[str] = file.field("tokenizer.ggml.tokens")
    merges: list[tuple[str, str]] = []
    for m in file.field("tokenizer.ggml.merges"):
        left, right = m.split(" ", 1)
        merges.append((left, right))
    tok = Tokenizer(
        models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False)
    )
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    return tok


SPACE = "\u2581"  # SentencePiece's visible space


def _sentencepiece(file: GGUFFile) -> Tokenizer:
    """Llama 2's, Mistral's and TinyLlama's tokenizer: SentencePiece BPE, which merges
    the adjacent pair whose union scores highest until none is in the vocabulary, and
    spells what is left as byte tokens (``<0x41>``). As a BPE model: every split of a
    piece into two pieces is a merge, ranked by the union's score. Spaces are U+2581,
    with one in front of the text where the file says so (``add_space_prefix``). Each
    token decodes with its own spaces (no prefix stripped): a stream joins them."""
    tokens: list[str] = file.field("tokenizer.ggml.tokens")
    scores = [float(x) for x in np.asarray(file.field("tokenizer.ggml.scores"))]
    ids = {t: i for i, t in enumerate(tokens)}
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, i in ids.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-scores[i], ids[left], ids[right], left, right))
    merges = [(left, right) for *_, left, right in sorted(ranked)]
    unk = int(file.metadata.get("tokenizer.ggml.unknown_token_id", 0))
    tok = Tokenizer(
        models.BPE(
            vocab=ids, merges=merges, unk_token=tokens[unk], fuse_unk=True, byte_fallback=True
        )
    )
    steps: list[normalizers.Normalizer] = [normalizers.Replace(" ", SPACE)]
    if file.metadata.get("tokenizer.ggml.add_space_prefix", True):
        steps.insert(0, normalizers.Prepend(SPACE))
    tok.normalizer = normalizers.Sequence(steps)
    tok.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return tok


#: the most tokens one character can span (UTF-8 has at most 4 bytes a character)
MAX_SPLIT = 4
REPLACEMENT = "\ufffd"


class TextStream:
    """A generation's text, token by token, without breaking characters: a character
    whose UTF-8 bytes span several tokens (an emoji in byte-level BPE, an accent in
    SentencePiece's byte fallback) is held back until its last byte comes, then given
    whole. Decoding each token alone would give U+FFFD for each part."""

    def __init__(self, tokenizer: Tokenizer, held: list[int] | None = None) -> None:
        """``held``: the tokens of a character begun before (a stream resumed)."""
        self.tokenizer = tokenizer
        self.held: list[int] = held or []

    def push(self, token: int) -> str:
        """The text ``token`` completes ("" while a character is still incomplete)."""
        ids = [*self.held, token]
        text: str = self.tokenizer.decode(ids)
        if text.endswith(REPLACEMENT) and len(ids) < MAX_SPLIT:
            self.held = ids
            return ""
        self.held = []
        return text


def eos_ids(path: Path) -> frozenset[int]:
    """The ids that end a generation: the file's EOS, and its end-of-turn token if it
    names one (a chat model's answer ends there)."""
    meta = GGUFFile(path).metadata
    ids = {meta.get("tokenizer.ggml.eos_token_id"), meta.get("tokenizer.ggml.eot_token_id")}
    return frozenset(int(i) for i in ids if i is not None)


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
