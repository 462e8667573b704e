"""The tokenizers rebuilt from a GGUF's metadata give llama.cpp's token ids: SentencePiece
(Llama 2, Mistral, TinyLlama) on a small vocabulary, and byte-level BPE on SmolLM2's under
each pre-tokenizer the engine knows (SmolLM2's, GPT-2's, Llama 3's, Qwen2's). The ids are
llama.cpp's own, from ``golden/make_synthetic_golden.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gguf import GGMLQuantizationType as Q

from hecate.llm.store import pull
from hecate.llm.tokenizer import TextStream, TokenizerError, end_ids, eos_ids, load_tokenizer
from hecate_dev.synthetic_gguf import Shape, spm_vocabulary, write
from tests.shared.engine.golden.make_synthetic_golden import HERE, tokenizer_cases

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

GOLDEN: dict[str, Any] = json.loads((HERE / "tokenizers.json").read_text())


@pytest.fixture(scope="module")
def cases() -> dict[str, dict[str, Any]]:
    return tokenizer_cases(pull("smollm2-135m", progress=lambda _line: None))


@pytest.mark.parametrize("case", sorted(GOLDEN["ids"]))
def test_a_rebuilt_tokenizer_gives_llama_cpp_s_ids(
    case: str, cases: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    path = write(tmp_path / f"{case}.gguf", Q.F32, Shape(layers=1), tokenizer=cases[case])
    tok = load_tokenizer(path)
    for text, want in GOLDEN["ids"][case].items():
        ids = tok.encode(text).ids
        assert ids == want, text
        if case == "spm" and text.isascii() and "<" not in text:
            # Each token decodes with its own spaces: a stream of them joins up.
            assert "".join(tok.decode([i]) for i in ids[1:]) == " " + text


def test_the_pre_tokenizers_split_these_texts_differently() -> None:
    """Else the check above could not tell GPT-2's split from Llama 3's. (SmolLM2's and
    GPT-2's, and Llama 3's and Qwen2's, differ only in how they group digits, which a
    vocabulary of single digits, as SmolLM2's is, cannot show.)"""
    ids = GOLDEN["ids"]
    assert ids["bpe-gpt-2"] != ids["bpe-llama-bpe"]


def test_a_tokenizer_it_cannot_rebuild_is_named(
    cases: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    for key, value, says in (
        ("tokenizer.ggml.model", "rwkv", "tokenizer 'rwkv' is not supported"),
        ("tokenizer.ggml.pre", "deepseek-coder", "pre-tokenizer 'deepseek-coder'"),
    ):
        meta = {**cases["bpe-smollm"], key: value}
        path = write(tmp_path / f"{value}.gguf", Q.F32, Shape(layers=1), tokenizer=meta)
        with pytest.raises(TokenizerError, match=says):
            load_tokenizer(path)


@pytest.mark.parametrize("case", ["bpe-smollm", "spm"])
def test_a_stream_of_tokens_gives_characters_whole(
    case: str, cases: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """A character over several tokens (its UTF-8 bytes split) comes whole, with the
    token that ends it: the streamed text is the text, where each token decoded alone
    gives replacement characters."""
    path = write(tmp_path / f"{case}.gguf", Q.F32, Shape(layers=1), tokenizer=cases[case])
    tok = load_tokenizer(path)
    text = " café, 😀 and 中文 at last"
    ids = tok.encode(text).ids[1 if case == "spm" else 0 :]  # SentencePiece adds BOS
    alone = "".join(tok.decode([i]) for i in ids)
    assert "\ufffd" in alone  # the case is one where decoding alone breaks characters
    stream = TextStream(tok)
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces).strip() == text.strip()
    assert "\ufffd" not in "".join(pieces)


def test_the_last_stage_holds_a_character_per_session_and_nothing_once_it_is_whole() -> None:
    """Two sessions, each mid-emoji, interleaved: each gets its own character whole, and
    no session is remembered once its character is out (nor after a fresh start)."""
    from hecate.llm.executor import LlmExecutor
    from tests.shared.engine.test_llama_batch import request

    llm = LlmExecutor()
    ids = llm.tokenizer().encode("😀").ids
    assert len(ids) > 1  # the emoji spans tokens
    texts: dict[str, str] = {"a": "", "b": ""}
    for step, token in enumerate(ids):
        for session in texts:
            texts[session] += llm._text(request(session=session, step=step), token)
    assert texts == {"a": "😀", "b": "😀"}
    assert llm._held == {}
    llm._text(request(session="a", step=0), ids[0])  # held: a character begun
    assert llm._text(request(session="a", step=0), ids[0]) == ""  # a new start drops it
    assert llm._held == {"a": [ids[0]]}
    llm.release("a")
    assert llm._held == {}


def test_a_generation_ends_on_llama_cpp_s_end_of_generation_tokens() -> None:
    """By their text, whatever their type, with the ids the file names (EOS, end of
    turn, fill-in-the-middle's) and llama.cpp's two exceptions."""
    tokens = ["<pad>", "<eos>", "<end_of_turn>", "</s>", "<|fim_pad|>", "<PAD>", "hello"]
    assert end_ids(tokens, {"tokenizer.ggml.eos_token_id": 1}) == {1, 2, 3, 4, 5}
    named = {"tokenizer.ggml.fim_pad_token_id": 5, "tokenizer.ggml.eos_token_id": 6}
    assert end_ids(tokens, named) == {1, 2, 3, 5, 6}  # a named FIM id, not its texts
    assert end_ids(tokens, {"tokenizer.ggml.eos_token_id": 99}) == {1, 2, 3, 4, 5}
    harmony = ["<|end|>", "<|return|>", "<|call|>", "<|endoftext|>"]
    assert end_ids(harmony, {}) == {1, 2, 3}  # <|end|> ends a message, not the answer
    assert end_ids(["<|end|>", "<|return|>"], {}) == {0, 1}
    assert end_ids(["</s>", "<|tool_response>"], {}) == {1}  # </s> a plain token there


def test_smollm2_s_generation_ends_where_llama_cpp_s_does() -> None:
    """llama.cpp's ``llama_vocab_is_eog`` on SmolLM2's file: its EOS ``<|im_end|>``, and
    by their text ``<|endoftext|>`` and ``<reponame>`` (a FIM repository token)."""
    assert eos_ids(pull("smollm2-135m", progress=lambda _line: None)) == {0, 2, 4}


def test_user_defined_tokens_are_taken_whole_from_the_raw_text(tmp_path: Path) -> None:
    """As llama.cpp: a user-defined token (Gemma's runs of spaces, its HTML tags) is
    matched in the text before SentencePiece splits it, and decodes as it is written;
    without ``add_space_prefix`` no space is put in front. (Gemma's own file, against
    llama.cpp's ids: test_gemma3_tokenizer.py.)"""
    meta = spm_vocabulary()
    tokens, types, scores = (
        list(meta[f"tokenizer.ggml.{k}"]) for k in ("tokens", "token_type", "scores")
    )
    for piece in ("  ", "<b>"):
        tokens.append(piece)
        types.append(4)
        scores.append(0.0)
    meta.update(
        {
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.add_space_prefix": False,
        }
    )
    tok = load_tokenizer(write(tmp_path / "ud.gguf", Q.F32, Shape(layers=1), tokenizer=meta))
    text = "the  cat <b>sat</b>"
    ids = tok.encode(text).ids
    assert ids[0] == meta["tokenizer.ggml.bos_token_id"]
    assert len(tokens) - 2 in ids  # the two spaces
    assert len(tokens) - 1 in ids  # <b>
    assert not str(tok.id_to_token(ids[1])).startswith("\u2581")
    assert tok.decode(ids) == text
