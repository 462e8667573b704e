"""GGUF files made to break the reader, or whose header disagrees with its weights: each
is refused with a typed error whose one line names the cause, by the library and by
``hecate model add`` (one line on stderr, exit 2, no traceback), never registered."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import struct
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hecate.llm.gguf_file import BadGGUF, GGUFFile
from hecate.llm.gguf_model import check_shapes, read_config
from hecate.llm.quant import UnsupportedWeights, check_types
from hecate.llm.store import ModelStoreError, add, registered
from hecate.llm.tokenizer import TokenizerError, check_tokenizer, load_tokenizer
from hecate_dev.synthetic_gguf import Shape, spm_vocabulary, write
from hecate_launcher import hecate_command

#: GGUF's metadata types (gguf_file.SCALARS, STRING, ARRAY)
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = (
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
)  # fmt: skip
FORMATS = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?",
           U64: "Q", I64: "q", F64: "d"}  # fmt: skip
SHAPE = Shape(layers=2, context=64)  # 256 wide, 4 heads of 64, 2 KV heads, ffn 512

#: a value as the file holds it: its type, then its bytes
Value = tuple[int, bytes]


def _bytes(raw: bytes) -> bytes:
    return struct.pack("<Q", len(raw)) + raw


def scalar(kind: int, value: Any) -> Value:
    return kind, struct.pack("<" + FORMATS[kind], value)


def string(text: str | bytes) -> Value:
    return STRING, _bytes(text.encode() if isinstance(text, str) else text)


def strings(items: list[str | bytes]) -> Value:
    raw = [i.encode() if isinstance(i, str) else i for i in items]
    return ARRAY, struct.pack("<IQ", STRING, len(raw)) + b"".join(_bytes(r) for r in raw)


def nested(depth: int) -> Value:
    """``depth`` arrays, each holding the next, the innermost one number: [[[7]]]..."""
    payload = struct.pack("<IQ", U32, 1) + struct.pack("<I", 7)
    for _ in range(depth - 1):
        payload = struct.pack("<IQ", ARRAY, 1) + payload
    return ARRAY, payload


def rewrite(source: Path, target: Path, changes: Mapping[str, Value | None]) -> Path:
    """``source`` with the metadata ``changes`` made (a key set, or dropped with None),
    its tensors and their bytes as they were, after the header's new end."""
    reader = GGUFReader(source)
    entries = [
        b"".join(part.tobytes() for part in field.parts)
        for key, field in reader.fields.items()
        if not key.startswith("GGUF.") and key not in changes
    ]
    for key, value in changes.items():
        if value is not None:
            kind, raw = value
            entries.append(_bytes(key.encode()) + struct.pack("<I", kind) + raw)
    infos = b"".join(b"".join(p.tobytes() for p in t.field.parts) for t in reader.tensors)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(reader.tensors), len(entries))
    head += b"".join(entries) + infos
    align = 32
    if (wanted := changes.get("general.alignment")) and wanted[0] == U32 and len(wanted[1]) == 4:
        (value,) = struct.unpack("<I", wanted[1])
        align = value if value > 0 and not value & (value - 1) and value <= 1 << 16 else 32
    data = source.read_bytes()[reader.data_offset :]
    target.write_bytes(head + bytes(-len(head) % align) + data)
    return target


def gpt2_vocabulary() -> dict[str, Any]:
    """A byte-level BPE vocabulary in GPT-2's layout, small: the 256 byte characters, a
    few merges, an end-of-text control token."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    chars = [chr(b) if b in printable else chr(next(extra)) for b in range(256)]
    merges = ["Ġ t", "h e", "Ġt he"]
    tokens = [*chars, "Ġt", "he", "Ġthe", "<|endoftext|>"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * (len(tokens) - 1) + [3],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": len(tokens) - 1,
        "tokenizer.ggml.eos_token_id": len(tokens) - 1,
    }


VOCABULARIES: dict[str, Callable[[], dict[str, Any]]] = {
    "spm": spm_vocabulary,
    "gpt2": gpt2_vocabulary,
}


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A small valid model per tokenizer kind: what each hostile file is made from."""
    folder = tmp_path_factory.mktemp("bases")
    return {
        kind: write(folder / f"{kind}.gguf", Q.Q8_0, SHAPE, floats=True, tokenizer=vocab())
        for kind, vocab in VOCABULARIES.items()
    }


@pytest.fixture
def base(bases: dict[str, Path]) -> Path:
    return bases["spm"]


@pytest.fixture(autouse=True)
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model cache of its own: the registry each test starts empty."""
    cache = tmp_path / "models"
    monkeypatch.setenv("HECATE_MODELS", str(cache))
    return cache


def refused(path: Path, says: str) -> None:
    """``hecate model add`` refuses ``path``: one line naming the cause, nothing added."""
    with pytest.raises(ModelStoreError, match=says) as raised:
        add("m", path, progress=lambda _line: None)
    assert "\n" not in raised.value.message
    assert registered() == {}


def test_the_base_files_are_models_that_are_added(bases: dict[str, Path]) -> None:
    for kind, path in bases.items():
        entry = add(kind, path, progress=lambda _line: None)
        assert (entry.arch, entry.layers) == ("llama", SHAPE.layers)
    assert sorted(registered()) == sorted(bases)


def test_a_rewritten_file_is_the_same_file(base: Path, tmp_path: Path) -> None:
    """The tests' own rewriting, checked: with no change it gives the very bytes."""
    copy = rewrite(base, tmp_path / "copy.gguf", {})
    assert copy.read_bytes() == base.read_bytes()


@pytest.mark.parametrize("alignment", [0, 3, 48, 1 << 30])
def test_an_alignment_that_is_not_a_power_of_two_is_refused(
    base: Path, tmp_path: Path, alignment: int
) -> None:
    path = rewrite(base, tmp_path / "a.gguf", {"general.alignment": scalar(U32, alignment)})
    says = f"general.alignment {alignment} is not a power of two"
    with pytest.raises(BadGGUF, match=says):
        GGUFFile(path)
    refused(path, says)


def test_an_alignment_of_another_type_is_refused(base: Path, tmp_path: Path) -> None:
    path = rewrite(base, tmp_path / "a.gguf", {"general.alignment": string("32")})
    refused(path, "general.alignment '32' is not a power of two")


def test_a_power_of_two_alignment_is_honoured(base: Path, tmp_path: Path) -> None:
    path = rewrite(base, tmp_path / "a.gguf", {"general.alignment": scalar(U32, 4096)})
    assert GGUFFile(path).tensors.keys() == GGUFFile(base).tensors.keys()
    add("m", path, progress=lambda _line: None)


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("llama.attention.head_count", scalar(U32, 0), "head_count 0 is not a whole number"),
        ("llama.attention.head_count_kv", scalar(U32, 0), "head_count_kv 0 is not a whole"),
        ("llama.attention.head_count_kv", scalar(U32, 3), "4 heads do not share 3 KV heads"),
        ("llama.attention.head_count", string("4"), "head_count '4' is not a whole number"),
        ("llama.attention.head_count", scalar(F32, 4.0), "head_count 4.0 is not a whole"),
        ("llama.embedding_length", scalar(U32, 7), "embedding_length 7 is not a whole number of"),
        ("llama.attention.key_length", scalar(U32, 33), "heads of 33 dimensions"),
        ("llama.context_length", scalar(I32, -1), "context_length -1 is not a whole number"),
        ("llama.attention.layer_norm_rms_epsilon", scalar(F32, float("nan")), "not a finite"),
        ("llama.rope.freq_base", scalar(F32, 0.0), "freq_base 0.0 is not a finite number"),
        ("general.architecture", scalar(U32, 5), "architecture 5 is not supported"),
        ("llama.rope.dimension_count", scalar(U32, 16), "RoPE on 16 of a head's 64 dimensions"),
        ("llama.attention.sliding_window", scalar(U32, 8), None),  # llama's: not read
    ],
    ids=["heads-0", "kv-heads-0", "kv-heads-3", "heads-str", "heads-float", "width-7",
         "key-length-odd", "context-negative", "eps-nan", "rope-base-0", "arch-int",
         "partial-rope", "window-on-llama"],
)  # fmt: skip
def test_impossible_hyper_parameters_are_refused_naming_them(
    base: Path, tmp_path: Path, key: str, value: Value, says: str | None
) -> None:
    path = rewrite(base, tmp_path / "h.gguf", {key: value})
    if says is None:  # a key the architecture does not read changes nothing
        assert read_config(GGUFFile(path)) == read_config(GGUFFile(base))
        return
    with pytest.raises(BadGGUF, match=says):
        read_config(GGUFFile(path))
    refused(path, says)


@pytest.mark.parametrize(
    ("count", "says"),
    [
        (1_000_000_000, "block_count 1000000000 is not a whole number from 1 to 4,096"),
        (3, "block_count 3, but its tensors are of blocks 0 to 1 \\(2 in all\\)"),
        (1, "block_count 1, but its tensors are of blocks 0 to 1 \\(2 in all\\)"),
    ],
)
def test_a_block_count_other_than_the_blocks_held_is_refused(
    base: Path, tmp_path: Path, count: int, says: str
) -> None:
    path = rewrite(base, tmp_path / "b.gguf", {"llama.block_count": scalar(U32, count)})
    with pytest.raises(BadGGUF, match=says):
        read_config(GGUFFile(path))
    refused(path, says)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (
            {"llama.embedding_length": scalar(U32, 128)},
            r"token_embd.weight is \[256, 400\], the metadata implies \[128, 400\]",
        ),
        (
            {"llama.attention.head_count_kv": scalar(U32, 4)},
            r"blk.0.attn_k.weight is \[256, 128\], the metadata implies \[256, 256\]",
        ),
        (
            {"llama.attention.key_length": scalar(U32, 32)},
            r"blk.0.attn_q.weight is \[256, 256\], the metadata implies \[256, 128\]",
        ),
        (
            {"llama.feed_forward_length": scalar(U32, 256)},
            r"blk.0.ffn_gate.weight is \[256, 512\], the metadata implies \[256, 256\]",
        ),
        (
            {"llama.vocab_size": scalar(U32, 500)},
            r"token_embd.weight is \[256, 400\], the metadata implies \[256, 500\]",
        ),
    ],
    ids=["embedding", "kv-heads", "key-length", "ffn", "vocab"],
)
def test_a_header_that_disagrees_with_its_tensors_is_refused(
    base: Path, tmp_path: Path, changes: dict[str, Value], says: str
) -> None:
    path = rewrite(base, tmp_path / "s.gguf", changes)
    file = GGUFFile(path)
    with pytest.raises(BadGGUF, match=says):
        check_shapes(file, read_config(file))
    refused(path, says)


@pytest.mark.parametrize(
    ("tensor", "says"),
    [
        (b"blk.1.ffn_up.weight", "no blk.1.ffn_up.weight"),
        (b"output_norm.weight", "no output_norm.weight"),
        (b"blk.0.attn_norm.weight", "no blk.0.attn_norm.weight"),
    ],
)
def test_a_model_without_a_tensor_it_runs_is_refused(
    base: Path, tmp_path: Path, tensor: bytes, says: str
) -> None:
    """The tensor renamed in place (same length: the rest of the file as it was)."""
    raw = base.read_bytes()
    assert raw.count(tensor) == 1
    path = tmp_path / "t.gguf"
    path.write_bytes(raw.replace(tensor, tensor[:-6] + b"wEight"))
    refused(path, says)


@pytest.mark.parametrize("depth", [9, 5_000])
def test_arrays_nested_too_deep_are_refused(base: Path, tmp_path: Path, depth: int) -> None:
    path = rewrite(base, tmp_path / "n.gguf", {"x.deep": nested(depth)})
    says = "metadata 'x.deep' nests arrays deeper than 8"
    with pytest.raises(BadGGUF, match=says):
        GGUFFile(path)
    refused(path, says)


def test_arrays_of_arrays_within_the_bound_are_read(base: Path, tmp_path: Path) -> None:
    path = rewrite(base, tmp_path / "n.gguf", {"x.deep": nested(8)})
    value = GGUFFile(path).metadata["x.deep"]
    for _ in range(7):
        assert isinstance(value, list)
        (value,) = value
    assert value.tolist() == [7]
    add("m", path, progress=lambda _line: None)


@pytest.mark.parametrize(
    ("header", "says"),
    [
        (struct.pack("<IQ", STRING, 1 << 60), "array 'x.long' of 1152921504606846976 items"),
        (struct.pack("<IQ", ARRAY, 1 << 40), "array 'x.long' of 1099511627776 items"),
        (struct.pack("<IQ", U64, 1 << 61), "array 'x.long' runs past the end"),
    ],
    ids=["strings", "arrays", "numbers"],
)
def test_an_array_longer_than_the_file_is_refused(
    base: Path, tmp_path: Path, header: bytes, says: str
) -> None:
    path = rewrite(base, tmp_path / "l.gguf", {"x.long": (ARRAY, header)})
    with pytest.raises(BadGGUF, match=says):
        GGUFFile(path)
    refused(path, says)


def test_a_token_that_is_not_utf8_is_refused(base: Path, tmp_path: Path) -> None:
    tokens: list[str | bytes] = list(GGUFFile(base).metadata["tokenizer.ggml.tokens"])
    tokens[300] = b"\xff\xfe"
    path = rewrite(base, tmp_path / "u.gguf", {"tokenizer.ggml.tokens": strings(tokens)})
    says = "item 300 of 'tokenizer.ggml.tokens' is not UTF-8"
    with pytest.raises(BadGGUF, match=says):
        load_tokenizer(path)
    refused(path, says)


@pytest.mark.parametrize("which", ["bos", "eos", "eot", "unknown"])
@pytest.mark.parametrize("kind", ["spm", "gpt2"])
def test_a_special_token_past_the_vocabulary_is_refused(
    bases: dict[str, Path], tmp_path: Path, which: str, kind: str
) -> None:
    base = bases[kind]
    size = len(GGUFFile(base).metadata["tokenizer.ggml.tokens"])
    key = f"tokenizer.ggml.{which}_token_id"
    path = rewrite(base, tmp_path / "s.gguf", {key: scalar(U32, size)})
    says = f"{key} {size} is not a token of its vocabulary of {size}"
    with pytest.raises(TokenizerError, match=says):
        load_tokenizer(path)
    refused(path, says)


def test_a_special_token_the_engine_never_reads_may_lie_past_it(base: Path, tmp_path: Path) -> None:
    """As llama.cpp loads them: real files carry a padding id one past their vocabulary."""
    key = "tokenizer.ggml.padding_token_id"
    path = rewrite(base, tmp_path / "p.gguf", {key: scalar(U32, 400)})
    add("m", path, progress=lambda _line: None)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"tokenizer.ggml.token_type": strings(["1"])}, "token_type is not an array of 400"),
        ({"tokenizer.ggml.scores": scalar(F32, 1.0)}, "scores is not an array of 400 numbers"),
        ({"tokenizer.ggml.tokens": scalar(U32, 1)}, "tokens is not a list of strings"),
        ({"tokenizer.ggml.add_bos_token": string("yes")}, "add_bos_token 'yes' is not true"),
        ({"tokenizer.ggml.model": nested(1)}, "tokenizer array"),
    ],
    ids=["types", "scores", "tokens", "flag", "model"],
)
def test_a_vocabulary_that_does_not_hold_together_is_refused(
    base: Path, tmp_path: Path, changes: dict[str, Value], says: str
) -> None:
    path = rewrite(base, tmp_path / "v.gguf", changes)
    refused(path, says)


def test_a_vocabulary_of_another_size_than_the_embedding_is_refused(
    base: Path, tmp_path: Path
) -> None:
    """As llama.cpp requires: a token without a row could not be embedded."""
    meta = GGUFFile(base).metadata
    tokens: list[str | bytes] = list(meta["tokenizer.ggml.tokens"][:399])
    scores = meta["tokenizer.ggml.scores"][:399].tobytes()
    types = meta["tokenizer.ggml.token_type"][:399].astype("<i4").tobytes()
    changes = {
        "tokenizer.ggml.tokens": strings(tokens),
        "tokenizer.ggml.scores": (ARRAY, struct.pack("<IQ", F32, 399) + scores),
        "tokenizer.ggml.token_type": (ARRAY, struct.pack("<IQ", I32, 399) + types),
    }
    path = rewrite(base, tmp_path / "v.gguf", changes)
    load_tokenizer(path)  # a tokenizer of its own right
    refused(path, "399 tokens, but its embedding has 400 rows")


@pytest.mark.parametrize(
    ("merges", "says"),
    [(["Ġt"], "merge 0 \\('Ġt'\\) is not two tokens apart by a space"),
     (["x y"], "its tokenizer cannot be built")],
)  # fmt: skip
def test_merges_that_are_not_of_the_vocabulary_are_refused(
    bases: dict[str, Path], tmp_path: Path, merges: list[str | bytes], says: str
) -> None:
    path = rewrite(bases["gpt2"], tmp_path / "g.gguf", {"tokenizer.ggml.merges": strings(merges)})
    with pytest.raises(TokenizerError, match=says):
        load_tokenizer(path)
    refused(path, says)


def test_what_no_check_foresaw_is_still_one_line_naming_the_file(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last line of defence: an error of no known kind from reading a file."""

    def broken(_file: object) -> None:
        raise RuntimeError("something\nunforeseen")

    monkeypatch.setattr("hecate.llm.quant.check_types", broken)
    refused(base, f"{base}: cannot be read as a model \\(RuntimeError: something unforeseen\\)")


def _hostile(base: Path, folder: Path) -> dict[str, Path]:
    tokens: list[str | bytes] = list(GGUFFile(base).metadata["tokenizer.ggml.tokens"])
    tokens[300] = b"\xc3\x28"
    return {
        "alignment": rewrite(base, folder / "a.gguf", {"general.alignment": scalar(U32, 0)}),
        "heads": rewrite(base, folder / "h.gguf", {"llama.attention.head_count": scalar(U32, 0)}),
        "nested": rewrite(base, folder / "n.gguf", {"x.deep": nested(5_000)}),
        "blocks": rewrite(base, folder / "b.gguf", {"llama.block_count": scalar(U32, 10**9)}),
        "width": rewrite(base, folder / "w.gguf", {"llama.embedding_length": scalar(U32, 7)}),
        "utf8": rewrite(base, folder / "u.gguf", {"tokenizer.ggml.tokens": strings(tokens)}),
        "bos": rewrite(base, folder / "s.gguf", {"tokenizer.ggml.bos_token_id": scalar(U32, 400)}),
        "template": rewrite(base, folder / "t.gguf", {"tokenizer.chat_template": string(LOOPS)}),
    }


#: A chat template whose loops multiply past any budget (each range alone is short).
LOOPS = "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}"


@pytest.mark.parametrize(
    ("template", "says"),
    [
        (LOOPS, "over 1,000,000 steps"),
        ("{{ 'x' * 300000000 }}", "over 1,048,576"),
        ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recursion too deep"),
        ("{{ raise_exception('no system messages') }}", "no system messages"),
        ("{% for m in messages %}", "does not compile"),
    ],
    ids=["loops", "huge", "recursion", "raises", "broken"],
)
def test_a_chat_template_that_cannot_render_a_chat_is_refused(
    base: Path, tmp_path: Path, models: Path, template: str, says: str
) -> None:
    del models
    path = rewrite(base, tmp_path / "t.gguf", {"tokenizer.chat_template": string(template)})
    refused(path, f"t.gguf's chat template .*{says}")


def test_a_chat_template_that_renders_a_chat_is_added(
    base: Path, tmp_path: Path, models: Path
) -> None:
    del models
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% endfor %}"
    path = rewrite(base, tmp_path / "t.gguf", {"tokenizer.chat_template": string(chatml)})
    assert add("m", path, progress=lambda _line: None).path == str(path)


def test_hecate_model_add_says_each_refusal_in_one_line(
    base: Path, tmp_path: Path, models: Path
) -> None:
    """The console script, as an operator runs it: exit 2, the refusal the last line of
    stderr and the only error, naming the file and the cause, no traceback; any line
    before it is the command's progress. A refusal from the header is the only line."""
    env = {**os.environ, "HECATE_MODELS": str(models)}
    header = {"alignment", "heads", "nested", "blocks", "width"}
    for case, path in _hostile(base, tmp_path).items():
        done = subprocess.run(
            [*hecate_command(), "model", "add", "m", str(path)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=120,
        )
        lines = done.stderr.splitlines()
        assert done.returncode == 2, (case, done.stderr)
        assert "Traceback" not in done.stderr, (case, done.stderr)
        assert done.stdout == "", case
        errors = [line for line in lines if line.startswith("hecate: error: ")]
        assert errors == lines[-1:], (case, done.stderr)
        assert str(path) in errors[0], case
        assert all(line.startswith("m: ") for line in lines[:-1]), (case, done.stderr)
        if case in header:
            assert len(lines) == 1, (case, done.stderr)
    assert registered() == {}


# Properties: a valid file whose metadata (or header bytes) are damaged at random is
# either still a model or refused with a typed error, whatever the damage.

TYPED = (BadGGUF, UnsupportedWeights, TokenizerError)
_serial = itertools.count()


def _checked(path: Path) -> None:
    """What ``hecate model add`` checks, as the library raises it (before the store's
    last line of defence would hide an untyped error)."""
    file = GGUFFile(path)
    config = read_config(file)
    check_types(file)
    check_shapes(file, config)
    load_tokenizer(path)
    check_tokenizer(file, config.vocab)


def _bounds(kind: int) -> tuple[int, int]:
    """The integers a metadata type of ``kind`` holds."""
    fmt = FORMATS[kind]
    bits = 8 * struct.calcsize(fmt)
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if fmt.islower() else (0, (1 << bits) - 1)


def _scalars(kind: int) -> st.SearchStrategy[Value]:
    if kind in (F32, F64):
        drawn: st.SearchStrategy[Any] = st.floats(width=32 if kind == F32 else 64)
    elif kind == BOOL:
        drawn = st.booleans()
    else:
        low, high = _bounds(kind)
        near = st.integers(max(low, -2), min(high, 600))
        drawn = st.one_of(near, st.integers(low, high))
    return drawn.map(lambda v: scalar(kind, v))


def _values() -> st.SearchStrategy[Value]:
    return st.one_of(
        st.sampled_from(sorted(FORMATS)).flatmap(_scalars),
        st.one_of(st.text(max_size=8), st.binary(max_size=8)).map(string),
        st.lists(st.one_of(st.text(max_size=4), st.binary(max_size=4)), max_size=6).map(strings),
        st.lists(st.integers(-5, 500), max_size=6).map(
            lambda xs: (ARRAY, struct.pack(f"<IQ{len(xs)}i", I32, len(xs), *xs))
        ),
        st.integers(1, 12).map(nested),
        st.tuples(st.integers(0, 20), st.binary(max_size=24)),  # any type, any bytes
    )


def _check_then_remove(path: Path) -> None:
    """:func:`_checked` on ``path``, which either passes or raises a typed error; then
    ``path`` and its prepared folder are removed (examples are many)."""
    try:
        with contextlib.suppress(*TYPED):
            _checked(path)
    finally:
        path.unlink()
        shutil.rmtree(path.with_name(path.name + ".f32"), ignore_errors=True)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_metadata_is_a_model_or_a_typed_refusal(
    bases: dict[str, Path], tmp_path: Path, data: st.DataObject
) -> None:
    base = bases[data.draw(st.sampled_from(sorted(bases)))]
    keys = sorted(k for k in GGUFFile(base).metadata if k != "general.alignment")
    changes = data.draw(
        st.dictionaries(
            st.sampled_from([*keys, "general.alignment"]),
            st.one_of(st.none(), _values()),
            min_size=1,
            max_size=3,
        )
    )
    _check_then_remove(rewrite(base, tmp_path / f"d{next(_serial)}.gguf", changes))


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_header_bytes_are_a_model_or_a_typed_refusal(
    bases: dict[str, Path], tmp_path: Path, data: st.DataObject
) -> None:
    base = bases[data.draw(st.sampled_from(sorted(bases)))]
    raw = bytearray(base.read_bytes())
    header = GGUFReader(base).data_offset
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(4, header - 1))
        raw[at] = data.draw(st.integers(0, 255))
    path = tmp_path / f"h{next(_serial)}.gguf"
    path.write_bytes(bytes(raw))
    _check_then_remove(path)
