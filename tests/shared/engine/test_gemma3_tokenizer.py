"""Gemma 3 270M, the built-in ``gemma3-270m``, as llama.cpp reads it: the tokenizer
rebuilt from its 262,144 SentencePiece pieces gives llama.cpp's ids (its runs of spaces,
tabs and newlines, its HTML tags, taken whole; no space put in front) and llama.cpp's
text back; a chat is rendered in Gemma's turns, as llama.cpp writes them; a generation
ends where llama.cpp's does (``<end_of_turn>``, not only the file's ``<eos>``). The
reference is llama.cpp's own, from ``golden/make_gemma3_golden.py``.

The file is the one ``hecate model pull gemma3-270m`` puts in the model cache: these
tests never download it, and skip, saying so, where it is not there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from hecate.llm.gguf_file import GGUFFile
from hecate.llm.store import MODELS, model_path, present
from hecate.llm.template import GEMMA3, load_template, template_fields, vet
from hecate.llm.tokenizer import TextStream, check_tokenizer, eos_ids, load_tokenizer

MODEL = "gemma3-270m"
GOLDEN: dict[str, Any] = json.loads(
    (Path(__file__).parent / "golden" / "gemma3-270m-tokenizer.json").read_text()
)
CASES = GOLDEN["texts"]


@pytest.fixture(scope="module")
def gemma() -> Path:
    if not present(MODEL):
        pytest.skip(f"{MODEL} is not in the model cache (`hecate model pull {MODEL}`)")
    return model_path(MODEL)


@pytest.fixture(scope="module")
def tokenizer(gemma: Path) -> Tokenizer:
    return load_tokenizer(gemma)


def test_the_reference_is_of_the_built_in_file() -> None:
    assert GOLDEN["sha256"] == MODELS[MODEL].sha256


@pytest.mark.parametrize("case", CASES, ids=[repr(c["text"])[1:-1][:24] for c in CASES])
def test_its_tokenizer_gives_llama_cpp_s_ids_and_text(
    tokenizer: Tokenizer, case: dict[str, Any]
) -> None:
    ids = case["ids"]
    assert tokenizer.encode(case["text"]).ids == ids
    assert tokenizer.decode(ids) == case["decoded"]  # BOS and control tokens left out
    stream = TextStream(tokenizer)
    assert "".join(stream.push(i) for i in ids) == case["decoded"]


def test_a_generation_ends_where_llama_cpp_s_does(gemma: Path) -> None:
    ends = eos_ids(gemma)
    assert ends == set(GOLDEN["eog"])
    tokens = GGUFFile(gemma).field("tokenizer.ggml.tokens")
    assert {"<eos>", "<end_of_turn>"} <= {tokens[i] for i in ends}


@pytest.mark.parametrize("chat", GOLDEN["chats"], ids=lambda c: f"{len(c['messages'])}-messages")
def test_a_chat_is_rendered_in_gemma_s_turns_as_llama_cpp_writes_them(
    gemma: Path, tokenizer: Tokenizer, chat: dict[str, Any]
) -> None:
    """The file carries no template: Gemma 3's own is used (llama.cpp detects it as
    Gemma's), its BOS left to the tokenizer, which adds it."""
    assert "tokenizer.chat_template" not in GGUFFile(gemma).metadata
    template = load_template(gemma)
    assert template.source == GEMMA3
    prompt = template.render([(role, content) for role, content in chat["messages"]])
    assert prompt == chat["prompt"]
    assert tokenizer.encode(prompt).ids == chat["ids"]


def test_its_tokenizer_and_template_pass_the_checks_of_an_added_model(gemma: Path) -> None:
    """What ``hecate model add`` asks of a tokenizer and a template refuses nothing of
    this file (its architecture's compute is another matter)."""
    file = GGUFFile(gemma)
    check_tokenizer(file, file.tensors["token_embd.weight"].shape[1])
    source = template_fields(gemma)["source"]
    assert source is not None
    vet(source)
