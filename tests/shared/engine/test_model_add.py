"""``hecate model add NAME PATH.gguf``: an operator's own GGUF, checked whole when added,
served by a swarm whose topology names it, refused when it is not what was checked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

from hecate.core.plan import SLUG_PATTERN
from hecate.executors import generative_model, get_executor
from hecate.llm.reference import greedy_text
from hecate.llm.store import NAME_PATTERN, ModelStoreError, add, known, model_path, pull, registered
from hecate_dev.synthetic_gguf import Shape, write
from hecate_launcher import hecate_command
from tests.support.swarm import infer_when_up

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

SMOLLM2 = "smollm2-135m"
QWEN = Shape(layers=3, arch="qwen2")


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model cache of its own (the registry lives there), SmolLM2 linked into it."""
    source = pull(SMOLLM2, progress=lambda _line: None)
    cache = tmp_path / "models"
    (cache / SMOLLM2).mkdir(parents=True)
    (cache / SMOLLM2 / source.name).symlink_to(source)
    monkeypatch.setenv("HECATE_MODELS", str(cache))
    return cache


def qwen_file(folder: Path, seed: int = 0) -> Path:
    """A small qwen2 of random weights with SmolLM2's tokenizer (a vocabulary to add)."""
    return write(
        folder / f"tiny-qwen-{seed}.gguf",
        Q.Q4_0,
        QWEN,
        seed,
        floats=True,
        tokenizer=model_path(SMOLLM2),
    )


def test_a_model_s_name_is_what_a_topology_accepts() -> None:
    assert NAME_PATTERN == SLUG_PATTERN


@pytest.mark.usefixtures("models")
def test_an_added_model_is_an_executor_of_its_own_name(tmp_path: Path) -> None:
    path = qwen_file(tmp_path)
    entry = add("tiny-qwen", path, progress=lambda _line: None)
    assert (entry.arch, entry.layers, entry.size) == ("qwen2", 3, path.stat().st_size)
    assert registered()["tiny-qwen"] == entry
    assert known() == ["gemma3-270m", SMOLLM2, "tiny-qwen"]  # built in, then added
    assert pull("tiny-qwen") == path.resolve()  # not copied, not fetched
    assert generative_model("tiny-qwen") == "tiny-qwen"
    executor = get_executor("tiny-qwen")
    assert executor.name == "tiny-qwen"
    assert executor.kind == "steps"


@pytest.mark.usefixtures("models")
def test_a_file_changed_after_it_was_added_is_refused(tmp_path: Path) -> None:
    path = qwen_file(tmp_path)
    add("tiny-qwen", path, progress=lambda _line: None)
    with path.open("r+b") as f:  # one weight byte, size unchanged: the time says so
        f.seek(-1, os.SEEK_END)
        f.write(b"\x00")
    with pytest.raises(ModelStoreError, match="changed since it was added"):
        pull("tiny-qwen")
    path.unlink()
    with pytest.raises(ModelStoreError, match="is gone"):
        pull("tiny-qwen")


def _lacking_model(path: Path, arch: str = "llama") -> Path:
    """A file of ``arch`` whose attention matrices are of two types the engine has no
    kernel for (IQ3_S and IQ2_XXS: zero bytes, never computed)."""
    w = GGUFWriter(str(path), arch)
    for key, value in (("block_count", 1), ("embedding_length", 256), ("feed_forward_length", 256)):
        w.add_uint32(f"{arch}.{key}", value)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_context_length(64)
    w.add_tensor("token_embd.weight", np.zeros((64, 256), np.float32))
    for name, kind in (("attn_q", Q.IQ3_S), ("attn_k", Q.IQ2_XXS), ("attn_v", Q.IQ3_S)):
        row = GGML_QUANT_SIZES[kind][1]  # one block of 256 a row
        w.add_tensor(f"blk.0.{name}.weight", np.zeros((256, row), np.uint8), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(
    ("name", "make", "says"),
    [
        ("Bad Name", lambda d: qwen_file(d), "lower-case letters"),
        (SMOLLM2, lambda d: qwen_file(d), "is a built-in model"),
        ("m", lambda d: d / "absent.gguf", "no such file"),
        ("m", lambda d: (d / "x.gguf", (d / "x.gguf").write_bytes(b"PK\x03\x04"))[0], "not a GGUF"),
        ("m", lambda d: write(d / "m.gguf", Q.Q8_0, Shape(layers=1)), "tokenizer 'no_vocab'"),
        ("m", lambda d: _lacking_model(d / "iq3.gguf"), "blk.0.attn_q.weight: weight type IQ3_S"),
    ],
    ids=["name", "built-in", "missing", "not-gguf", "no-tokenizer", "weight-type"],
)
@pytest.mark.usefixtures("models")
def test_what_cannot_be_served_is_refused_naming_why(
    tmp_path: Path, name: str, make: Callable[[Path], Path], says: str
) -> None:
    path = make(tmp_path)
    with pytest.raises(ModelStoreError, match=says):
        add(name, path, progress=lambda _line: None)
    assert registered() == {}


def test_a_swarm_serves_an_added_model_as_one_process_does(models: Path, tmp_path: Path) -> None:
    path = qwen_file(tmp_path, seed=1)
    env = {**os.environ, "HECATE_MODELS": str(models)}
    added = subprocess.run(
        [*hecate_command(), "model", "add", "tiny-qwen", str(path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    assert added.returncode == 0, added.stderr
    assert '"executor": "tiny-qwen"' in added.stdout
    listed = subprocess.run(
        [*hecate_command(), "model", "list"], capture_output=True, text=True, env=env, check=True
    )
    assert f"tiny-qwen\t{path.resolve()}, qwen2, 3 layers" in listed.stdout
    topology = tmp_path / "qwen.json"
    topology.write_text(
        json.dumps(
            {
                "models": [{"id": "tiny-qwen", "layers": 3, "executor": "tiny-qwen"}],
                "nodes": [
                    {"id": f"n-{i}", "capacity_layers": 1, "executor": "tiny-qwen"}
                    for i in range(3)
                ],
            }
        )
    )
    state = tmp_path / "state"
    argv = ["up", "--topology", str(topology), "--state", str(state), "--pipelines", "1"]
    up = subprocess.Popen(
        [*hecate_command(), *argv, "--routers", "1", "--gateway", "off"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    prompt = "The capital of France is"
    try:
        answer = infer_when_up(
            state, "tiny-qwen", prompt, "--max-tokens", "8", "--timeout", "20", within=120
        )
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=90)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.rstrip("\n") == greedy_text(path, prompt, 8)
    assert up.returncode == 0, out[-2000:]
    assert "Traceback" not in out, out[-3000:]


@pytest.mark.usefixtures("models")
def test_a_refusal_names_everything_the_file_lacks_at_once(tmp_path: Path) -> None:
    path = _lacking_model(tmp_path / "mamba.gguf", arch="mamba")
    with pytest.raises(ModelStoreError) as refused:
        add("m", path, progress=lambda _line: None)
    said = str(refused.value)
    assert "architecture 'mamba' is not supported" in said, said
    assert "cannot be read as a model" not in said, said  # a refusal, not a damaged file
    assert "blk.0.attn_q.weight: weight type IQ3_S is not supported (and 1 more matrices)" in said
    assert "blk.0.attn_k.weight: weight type IQ2_XXS is not supported" in said
    assert registered() == {}
