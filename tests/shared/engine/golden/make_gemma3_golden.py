"""Writes llama.cpp's reference for the engine's tokenizer, chat template and ends of a
generation on Gemma 3 270M, the built-in ``gemma3-270m``
(tests/shared/engine/test_gemma3_tokenizer.py): ``gemma3-270m-tokenizer.json``.

For each of :data:`TEXTS` (spaces, double spaces, newlines, tabs, digits, accents,
emoji in byte tokens, code, HTML tags, Gemma's own ``<start_of_turn>``...): llama.cpp's
ids (``add_bos``, special tokens parsed, as a prompt is tokenized) and its text out of
those ids (``llama_detokenize``: special tokens left out, as a stream of a generation is
read). Then the ids llama.cpp ends a generation on (``llama_vocab_is_eog``), and for a
few chats the prompt llama.cpp writes with its own Gemma template (the one it detects in
Gemma's Jinja template, :data:`hecate.llm.template.GEMMA3`) and that prompt's ids.

Run by hand, with the model pulled and the ``bench`` extra installed (it builds
llama-cpp-python)::

    .venv/bin/hecate model pull gemma3-270m
    .venv/bin/python tests/shared/engine/golden/make_gemma3_golden.py
"""

from __future__ import annotations

import ctypes
import importlib
import json
from pathlib import Path
from typing import Any

from hecate.llm.store import MODELS, pull
from hecate.llm.template import GEMMA3

MODEL = "gemma3-270m"
GOLDEN = Path(__file__).resolve().parent / "gemma3-270m-tokenizer.json"
TEXTS = (
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "  two leading spaces",
    "double  space between",
    "triple   space and    four",
    "trailing space ",
    "tabs\tand\t\ttwo tabs",
    "line one\nline two",
    "para one\n\npara two\n\n\nthree",
    "\n starts with a newline",
    "digits 1234567890 and 3.14159 and 1,000,000",
    "2025-01-31 12:34:56",
    "caf\u00e9 r\u00e9sum\u00e9 na\u00efve \u00c5ngstr\u00f6m",
    "\u00dcn\u00efc\u00f6d\u00e9 fa\u00e7ade \u2014 \u201cquotes\u201d "
    "and \u2018single\u2019 \u2026",
    "emoji \U0001f600\U0001f389\U0001f44d\U0001f3fd and \U0001f1f3\U0001f1f4 flag",
    "\u4e2d\u6587\u6d4b\u8bd5\uff0c\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "\u0417\u0434\u0440\u0430\u0432\u0441\u0442\u0432\u0443\u0439, \u043c\u0438\u0440! "
    "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    '{"key": "value", "list": [1, 2, 3]}',
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n",
    "<table><tr><td>cell</td></tr></table>",
    "<b>bold</b> and <i>italic</i> and <code>x</code>",
    "====== ------------------------------ aaaaaaaaaaaaaaa !!!!!!!! ........",
    "0000000000 1111111",
    "abc\u200bdef zero width, \u00a0no-break",
    "xxx       y",
    "\uff26\uff35\uff2c\uff2c\uff37\uff29\uff24\uff34\uff28 and \ufb01 ligature",
    "I'm can't won't they're it's",
    "<unused0> <mask> [multimodal] <start_of_image>",
    " ",
    "\n",
    "\U0001f600",
)
CHATS = (
    [("user", "What is the capital of France?")],
    [("system", "Be brief."), ("user", "Hi")],
    [
        ("system", "You answer in French."),
        ("user", "Hello"),
        ("assistant", "Bonjour !"),
        ("user", "How are you?"),
    ],
)


def _detokenize(llama: Any, vocab: Any, ids: list[int]) -> str:
    array = (llama.llama_token * len(ids))(*ids)
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama.llama_detokenize(vocab, array, len(ids), buf, len(buf), False, False)
    assert n >= 0
    return bytes(buf.raw[:n]).decode("utf-8")


def _chat(llama: Any, messages: list[tuple[str, str]]) -> str:
    chat = (llama.llama_chat_message * len(messages))(
        *(llama.llama_chat_message(r.encode(), c.encode()) for r, c in messages)
    )
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama.llama_chat_apply_template(GEMMA3.encode(), chat, len(messages), True, buf, len(buf))
    assert n >= 0
    return bytes(buf.raw[:n]).decode("utf-8")


def main() -> None:
    llama = importlib.import_module("llama_cpp")
    path = pull(MODEL)
    llm: Any = llama.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = llama.llama_model_get_vocab(llm._model.model)
    count = llama.llama_vocab_n_tokens(vocab)
    cases = []
    for text in TEXTS:
        ids = llm.tokenize(text.encode(), add_bos=True, special=True)
        cases.append({"text": text, "ids": ids, "decoded": _detokenize(llama, vocab, ids)})
    chats = []
    for messages in CHATS:
        prompt = _chat(llama, messages)
        ids = llm.tokenize(prompt.encode(), add_bos=True, special=True)
        chats.append({"messages": messages, "prompt": prompt, "ids": ids})
    golden = {
        "llama_cpp_python": llama.__version__,
        "sha256": MODELS[MODEL].sha256,
        "eog": [i for i in range(count) if llama.llama_vocab_is_eog(vocab, i)],
        "texts": cases,
        "chats": chats,
    }
    # One case a line: the file stays small to read and to diff.
    parts = []
    for key, value in golden.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            rows = ",\n".join(f"    {json.dumps(row)}" for row in value)
            parts.append(f"  {json.dumps(key)}: [\n{rows}\n  ]")
        else:
            parts.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    GOLDEN.write_text("{\n" + ",\n".join(parts) + "\n}\n")
    print(f"{GOLDEN}: {len(cases)} texts, {len(chats)} chats, end of generation {golden['eog']}")


if __name__ == "__main__":
    main()
