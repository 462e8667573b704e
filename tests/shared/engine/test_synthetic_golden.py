"""The engine, and the numpy model it is held against, on llama.cpp's own answers for
small synthetic models of every weight type and attention shape they claim.

``golden/make_synthetic_golden.py`` (run by hand, with llama.cpp) made each case: random
float32 weights, quantised by llama.cpp's quantiser, run by llama.cpp. Here each file is
taken as committed (k-quants) or written again from the same seed with ``gguf``'s
quantisers, which must give llama.cpp's very bytes (the tensors' hash says so). Then,
per file: the step-0 logits correlate with llama.cpp's at 0.998 or better, and fed
llama.cpp's own greedy tokens (teacher-forced), the engine picks llama.cpp's token at
every step where llama.cpp's margin between its two best exceeds 0.5.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from gguf import GGMLQuantizationType as Q

from hecate.llm.gguf_model import load_stage, model_config
from hecate.llm.llama import LlamaStage
from hecate.llm.onnx_stage import OnnxStage
from hecate_dev.synthetic_gguf import Shape, tensors_sha256, write

GOLDEN = Path(__file__).resolve().parent / "golden" / "synthetic"
#: every case, a mixture of experts' under ``moe/`` (tokenizers.json is not a model)
CASES = sorted(str(p.relative_to(GOLDEN).with_suffix("")) for p in GOLDEN.glob("**/*.npz"))
CORRELATION = 0.998
MARGIN = 0.5

Logits = npt.NDArray[np.float32]
#: feeds a list of token ids as the next positions, returns the last one's logits
Feed = Callable[[list[int]], Logits]


def golden(case: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GOLDEN / f"{case}.json").read_text())
    data["step0_logits"] = np.load(GOLDEN / f"{case}.npz")["step0_logits"]
    return data


def model_file(case: str, folder: Path) -> Path:
    g = golden(case)
    path = folder / f"{case.replace('/', '-')}.gguf"
    if g["file_kept"]:
        shutil.copy(GOLDEN / f"{case}.gguf", path)  # the reference's cache goes beside it
    else:
        write(path, Q[g["type"]], Shape(**g["shape"]), g["seed"], floats=True)
    assert tensors_sha256(path) == g["tensors_sha256"], "not the weights llama.cpp ran"
    return path


def engine(path: Path) -> Feed:
    stage = OnnxStage(path, 0, _layers(path), threads=1, slots=1)
    slot = stage.new_cache()
    return lambda ids: stage.forward_batch([stage.embed(ids)], [slot])[0][0]


def _layers(path: Path) -> int:
    return model_config(path).layers


def reference(stage: LlamaStage) -> Feed:
    cache = stage.new_cache()
    return lambda ids: stage.logits(stage.forward(stage.embed(ids), cache))


def disagreements(feed: Feed, g: dict[str, Any], correlation: float = CORRELATION) -> list[str]:
    """What differs from llama.cpp: the step-0 correlation (below ``correlation``), and
    each confident step whose token is not llama.cpp's. Empty: agreement."""
    out = []
    logits = feed(g["prompt"])
    r = float(np.corrcoef(logits, g["step0_logits"])[0, 1])
    if not r >= correlation:
        out.append(f"step-0 logits correlate at {r:.5f}")
    for step, (want, margin) in enumerate(zip(g["greedy"], g["margins"], strict=True)):
        got = int(np.argmax(logits))
        if margin > MARGIN and got != want:
            out.append(f"step {step}: {got}, llama.cpp {want} (margin {margin:.2f})")
        logits = feed([want])  # teacher-forced: llama.cpp's own continuation
    return out


def test_every_case_has_steps_where_llama_cpp_is_sure() -> None:
    """A case whose margins were all small would check the tokens of no step."""
    assert len(CASES) >= 16
    for case in CASES:
        assert sum(m > MARGIN for m in golden(case)["margins"]) >= 3, case


@pytest.mark.parametrize("case", CASES)
def test_the_engine_answers_as_llama_cpp(case: str, tmp_path: Path) -> None:
    assert disagreements(engine(model_file(case, tmp_path)), golden(case)) == []


@pytest.mark.parametrize("case", CASES)
def test_the_numpy_model_answers_as_llama_cpp(case: str, tmp_path: Path) -> None:
    path = model_file(case, tmp_path)
    stage = LlamaStage(load_stage(path, 0, _layers(path)))
    assert disagreements(reference(stage), golden(case)) == []


def _without_bias(stage: LlamaStage) -> LlamaStage:
    blocks = [replace(b, bqkv=None) for b in stage.w.blocks]
    return LlamaStage(replace(stage.w, blocks=blocks))


def _config(**changes: Any) -> Callable[[LlamaStage], LlamaStage]:
    def change(stage: LlamaStage) -> LlamaStage:
        return LlamaStage(replace(stage.w, config=replace(stage.config, **changes)))

    return change


def _blocks(**changes: Any) -> Callable[[LlamaStage], LlamaStage]:
    def change(stage: LlamaStage) -> LlamaStage:
        blocks = [replace(b, **changes) for b in stage.w.blocks]
        return LlamaStage(replace(stage.w, blocks=blocks))

    return change


def _up_before_gate(stage: LlamaStage) -> LlamaStage:
    """The fused matrix's halves read the other way round (up first, then the gate)."""
    blocks = []
    for b in stage.w.blocks:
        assert b.w_gate_up is not None
        blocks.append(replace(b, w_gate_up=np.roll(b.w_gate_up, b.w_gate_up.shape[1] // 2, 1)))
    return LlamaStage(replace(stage.w, blocks=blocks))


def _tied(stage: LlamaStage) -> LlamaStage:
    return LlamaStage(replace(stage.w, head=stage.w.embedding))


MISTAKES: dict[str, tuple[str, Callable[[LlamaStage], LlamaStage]]] = {
    "qwen2's biases left out": ("qwen2-qkv-bias", _without_bias),
    "qwen2's RoPE on adjacent pairs": ("qwen2-qkv-bias", _config(rope_interleaved=True)),
    "llama's RoPE on halves": ("type-F32", _config(rope_interleaved=False)),
    "Llama 3's frequency factors left out": ("llama3-rope-scaling", _config(rope_factors=None)),
    "a linear RoPE factor left out": ("linear-rope-scaling", _config(rope_scale=1.0)),
    "a separate head read as the embedding": ("separate-head", _tied),
    "qwen3's Q/K norms left out": ("qwen3-qk-norm", _blocks(q_norm=None, k_norm=None)),
    "phi3's fused gate and up read up first": ("phi3-fused", _up_before_gate),
    "phi3's RoPE on adjacent pairs": ("phi3-fused", _config(rope_interleaved=True)),
    "mixtral's top 1 expert alone": ("moe/mixtral", _config(experts_used=1)),
    "qwen3moe's top 3 experts": ("moe/qwen3moe", _config(experts_used=3)),
    "gemma3's Q/K norms left out": ("gemma3", _blocks(q_norm=None, k_norm=None)),
    "gemma3's norms after attention and FFN left out": (
        "gemma3",
        _blocks(post_attn_norm=None, post_ffn_norm=None),
    ),
    "gemma3's GELU taken for SiLU": ("gemma3", _config(gelu=False)),
    "gemma3's embedding unscaled": ("gemma3", _config(embed_scale=1.0)),
    "gemma3's sliding window left out": ("gemma3", _config(window=0, sliding_layers=())),
    "gemma3's sliding window one short": ("gemma3", _config(window=15)),
    "gemma3's sliding layers on the global RoPE base": ("gemma3", _config(rope_base_swa=1e6)),
    "gemma3's sliding and global layers swapped": (
        "gemma3",
        _config(sliding_layers=(False, True)),
    ),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_the_check_fails_a_model_read_wrong(mistake: str, tmp_path: Path) -> None:
    case, wrong = MISTAKES[mistake]
    path = model_file(case, tmp_path)
    stage = wrong(LlamaStage(load_stage(path, 0, _layers(path))))
    assert disagreements(reference(stage), golden(case)), mistake
