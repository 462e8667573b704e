"""The GPT-2 style byte-level BPE tokenizer, rebuilt from the GGUF's own vocabulary.

The GGUF says which pre-tokenizer splits the text before the byte-level BPE
(``tokenizer.ggml.pre``, as llama.cpp reads it): SmolLM2's (``smollm``) splits digits one
by one before GPT-2's split; Llama 3's (``llama-bpe``) and Qwen2's (``qwen2``) split by
their own expressions (digits in threes, or one by one). Special tokens (``<|im_start|>``
...) are never split. BOS is added where the file says so (``add_bos_token``).

As llama.cpp, the file's user-defined tokens (Gemma's runs of spaces, tabs and newlines,
its HTML tags) are taken out of the text before the model splits it, whatever the text:
two spaces are the token of two spaces, not two of one. A generation ends on llama.cpp's
end-of-generation tokens (:func:`eos_ids`): the file's EOS and, found by their text,
the ends of a turn (``<end_of_turn>``, ``<|im_end|>``, ``<|eot_id|>``...).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import (
    AddedToken,
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
USER_DEFINED = 4  # GGUF token_type of tokens matched in the text before the model
#: the prepared folder's copy of the rebuilt tokenizer (named anew when the rebuild
#: changes, so that one built before is not taken for it)
PREPARED = "tokenizer.v2.json"

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


#: the special tokens the engine reads (the prompt's BOS, the ends of a generation,
#: SentencePiece's unknown token), by their key's middle: each must be a token of the
#: vocabulary. Others a file may name (padding, mask, fill-in-the-middle...) the engine
#: never reads, and llama.cpp only warns about one out of range: real files carry a
#: padding id one past their vocabulary, and they load.
SPECIAL = ("bos", "eos", "eot", "unknown")


def load_tokenizer(path: Path) -> Tokenizer:
    """From the prepared folder when it is there (instant), else built from the GGUF."""
    from hecate.llm.gguf_model import Prepared

    return Tokenizer.from_str(Prepared(path).text(PREPARED, lambda: _build(path).to_str()))


def vocabulary(file: GGUFFile) -> list[str]:
    """The token texts (``tokenizer.ggml.tokens``), every one decoded now: one that is not
    text is :class:`~hecate.llm.gguf_file.BadGGUF` naming it."""
    tokens = file.field("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise TokenizerError(f"{file.path}: tokenizer.ggml.tokens is not a list of strings")
    return tokens


def special_ids(file: GGUFFile, count: int) -> dict[str, int]:
    """The ids of :data:`SPECIAL` tokens the file names, by name (``bos``...), each
    checked to be one of the ``count`` tokens of its vocabulary."""
    out = {}
    for name in SPECIAL:
        key = f"tokenizer.ggml.{name}_token_id"
        value = file.metadata.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < count:
            raise TokenizerError(
                f"{file.path}: {key} {value!r} is not a token of its vocabulary of {count}"
            )
        out[name] = value
    return out


def check_tokenizer(file: GGUFFile, vocab: int) -> None:
    """What a model's tokenizer must be beyond buildable (:func:`load_tokenizer`, which
    may come from the prepared folder): its texts, its special ids within it, and as many
    tokens as the model's embedding has rows (``vocab``), as llama.cpp requires (a token
    without a row cannot be embedded, a row without a token cannot be decoded)."""
    tokens = vocabulary(file)
    special_ids(file, len(tokens))
    if len(tokens) != vocab:
        raise TokenizerError(
            f"{file.path}: {len(tokens)} tokens, but its embedding has {vocab} rows"
        )


def _numbers(file: GGUFFile, key: str, count: int, kinds: str) -> list[Any]:
    """Metadata ``key``: an array of ``count`` numbers of numpy kinds ``kinds``."""
    value = file.field(key)
    if not isinstance(value, np.ndarray) or value.dtype.kind not in kinds or len(value) != count:
        raise TokenizerError(f"{file.path}: {key} is not an array of {count} numbers")
    return list(value.tolist())


def _flag(file: GGUFFile, key: str, default: bool) -> bool:
    value = file.metadata.get(key, default)
    if not isinstance(value, bool | int):
        raise TokenizerError(f"{file.path}: {key} {value!r} is not true or false")
    return bool(value)


def _library(path: Path, build: Callable[[], Tokenizer]) -> Tokenizer:
    """``build()``, the tokenizers library's refusal of what it was given (a merge of
    tokens not in the vocabulary...) as a :class:`TokenizerError`: the library raises
    bare ``Exception`` for it."""
    try:
        return build()
    except Exception as e:
        raise TokenizerError(f"{path}: its tokenizer cannot be built ({e})") from None


def _build(path: Path) -> Tokenizer:
    file = GGUFFile(path)
    kind = file.metadata.get("tokenizer.ggml.model")
    make: Callable[[GGUFFile, list[str], dict[str, int]], Tokenizer]
    if isinstance(kind, str) and kind == "gpt2":
        make = _byte_level_bpe
    elif isinstance(kind, str) and kind == "llama":
        make = _sentencepiece
    else:
        raise TokenizerError(
            f"{path}: tokenizer {kind!r} is not supported (supported: 'gpt2', byte-level "
            "BPE; 'llama', SentencePiece BPE)"
        )
    tokens = vocabulary(file)
    types = _numbers(file, "tokenizer.ggml.token_type", len(tokens), "iu")
    specials = special_ids(file, len(tokens))
    bos = specials.get("bos")
    add_bos = _flag(file, "tokenizer.ggml.add_bos_token", False)
    tok = make(file, tokens, specials)

    def finish() -> Tokenizer:
        # Matched in the raw text (spaces not yet U+2581), kept when decoding.
        user = [t for t, k in zip(tokens, types, strict=True) if k == USER_DEFINED]
        tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
        tok.add_special_tokens([t for t, k in zip(tokens, types, strict=True) if k == CONTROL])
        if add_bos and bos is not None:
            tok.post_processor = processors.TemplateProcessing(
                single=f"{tokens[bos]} $A", special_tokens=[(tokens[bos], bos)]
            )
        return tok

    return _library(path, finish)


def _byte_level_bpe(file: GGUFFile, tokens: list[str], specials: dict[str, int]) -> Tokenizer:
    del specials  # byte-level BPE has no unknown token; BOS is added by the caller
    pre = str(file.metadata.get("tokenizer.ggml.pre", "default"))
    if pre not in PRE_TOKENIZERS:
        raise TokenizerError(
            f"{file.path}: pre-tokenizer {pre!r} is not supported (supported: "
            f"{', '.join(PRE_TOKENIZERS)})"
        )
    merges: list[tuple[str, str]] = []
    raw = file.field("tokenizer.ggml.merges")
    if not isinstance(raw, list):
        raise TokenizerError(f"{file.path}: tokenizer.ggml.merges is not a list of strings")
    for i, m in enumerate(raw):
        if not isinstance(m, str) or " " not in m:
            raise TokenizerError(
                f"{file.path}: merge {i} ({m!r}) is not two tokens apart by a space"
            )
        left, right = m.split(" ", 1)
        merges.append((left, right))
    vocab = {t: i for i, t in enumerate(tokens)}

    def build() -> Tokenizer:
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
        tok.decoder = decoders.ByteLevel()
        return tok

    return _library(file.path, build)


SPACE = "\u2581"  # SentencePiece's visible space


def _sentencepiece(file: GGUFFile, tokens: list[str], specials: dict[str, int]) -> Tokenizer:
    """Llama 2's, Mistral's and TinyLlama's tokenizer: SentencePiece BPE, which merges
    the adjacent pair whose union scores highest until none is in the vocabulary, and
    spells what is left as byte tokens (``<0x41>``). As a BPE model: every split of a
    piece into two pieces is a merge, ranked by the union's score. Spaces are U+2581,
    with one in front of the text where the file says so (``add_space_prefix``). Each
    token decodes with its own spaces (no prefix stripped): a stream joins them."""
    scores = [float(x) for x in _numbers(file, "tokenizer.ggml.scores", len(tokens), "iuf")]
    ids = {t: i for i, t in enumerate(tokens)}
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, i in ids.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-scores[i], ids[left], ids[right], left, right))
    merges = [(left, right) for *_, left, right in sorted(ranked)]
    unk = specials.get("unknown", 0)
    space_prefix = _flag(file, "tokenizer.ggml.add_space_prefix", True)

    def build() -> Tokenizer:
        tok = Tokenizer(
            models.BPE(
                vocab=ids, merges=merges, unk_token=tokens[unk], fuse_unk=True, byte_fallback=True
            )
        )
        steps: list[normalizers.Normalizer] = [normalizers.Replace(" ", SPACE)]
        if space_prefix:
            steps.insert(0, normalizers.Prepend(SPACE))
        tok.normalizer = normalizers.Sequence(steps)
        tok.decoder = decoders.Sequence(
            [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
        )
        return tok

    return _library(file.path, build)


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


#: The texts of the tokens llama.cpp ends a generation on, whatever the file says of
#: them (llama-vocab.cpp's ``special_eog_ids``, "determined based on the token text").
EOG_TEXTS = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
        "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
        "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
        "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
    }
)  # fmt: skip
#: The fill-in-the-middle tokens it ends on too: each the id the file names, or where it
#: names none, the token of one of these texts (llama.cpp takes the first it meets in a
#: hash map's order; all of them here).
EOG_FIM = {
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
#: and the ids the file names: end of sequence, of turn, of message
EOG_NAMED = ("eos", "eot", "eom")


def end_ids(tokens: list[str], metadata: Any) -> frozenset[int]:
    """llama.cpp's end-of-generation set of a vocabulary (``tokens``) and the file's
    ``metadata``: :data:`EOG_TEXTS`, :data:`EOG_FIM` and :data:`EOG_NAMED`, less what
    llama.cpp takes out: ``<|end|>`` beside ``<|return|>`` and ``<|call|>`` (gpt-oss's
    end of a message, not of the answer) or ``<|calls|>`` and ``<|flush|>``; ``</s>``
    beside ``<|tool_response>`` or ``<|plamo:eos|>`` (a plain token there)."""

    def named(key: str) -> int | None:
        i = metadata.get(f"tokenizer.ggml.{key}_token_id")
        ok = isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(tokens)
        return i if ok else None

    ids = {i for i, text in enumerate(tokens) if text in EOG_TEXTS}
    ids |= {i for key in EOG_NAMED if (i := named(key)) is not None}
    for key, texts in EOG_FIM.items():
        i = named(key)
        ids |= {j for j, text in enumerate(tokens) if text in texts} if i is None else {i}
    have = {tokens[i] for i in ids}
    call = bool(have & {"<|call|>", "<|calls|>"})
    if "<|end|>" in have and call and have & {"<|return|>", "<|flush|>"}:
        ids = {i for i in ids if tokens[i] != "<|end|>"}
    if "</s>" in have and have & {"<|tool_response>", "<|plamo:eos|>"}:
        ids = {i for i in ids if tokens[i] != "</s>"}
    return frozenset(ids)


def eos_ids(path: Path) -> frozenset[int]:
    """The ids that end a generation, as llama.cpp's (:func:`end_ids`): the file's EOS,
    and a chat model's end of turn (Gemma's ``<end_of_turn>``, which is not its EOS)."""
    file = GGUFFile(path)
    tokens = file.metadata.get("tokenizer.ggml.tokens")
    return end_ids(tokens if isinstance(tokens, list) else [], file.metadata)


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
