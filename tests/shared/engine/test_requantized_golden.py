"""The engine on SmolLM2's real weights re-quantised into the types people download,
held to llama.cpp on each: ``llama-quantize`` (the bench extra's vendored build) makes
the very file llama.cpp ran (the tensors' hash checks it), and the engine must agree
with llama.cpp's recorded answers, teacher-forced, wherever llama.cpp was sure
(golden/make_requantized_golden.py). Skipped, with the reason, where llama-quantize is
not built.

Its step-0 logits must correlate with llama.cpp's at 0.998, or, where llama.cpp's own
rounding keeps exact arithmetic further away, as closely as exact arithmetic does (the
numpy model: the file's weights dequantised, float32 throughout) less 0.001. Measured:
exact arithmetic correlates with llama.cpp at 0.9962 on Q3_K_M and 0.9969 on IQ4_XS
(the engine 0.9959 and 0.9967; the engine with exact arithmetic 0.9989 and 0.9992), so
there the distance is llama.cpp's activations rounded to 8 bits per 256, not the
engine's; on Q4_K_M, 0.9980 and 0.9980."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hecate.llm.gguf_model import load_stage, model_config
from hecate.llm.llama import LlamaStage
from hecate.llm.quant import SUPPORTED
from hecate.llm.store import pull
from hecate_dev.bench.pooled import binary
from hecate_dev.synthetic_gguf import tensors_sha256
from tests.shared.engine.golden.make_requantized_golden import requantize
from tests.shared.engine.test_synthetic_golden import (
    CORRELATION,
    disagreements,
    engine,
    reference,
)

pytestmark = pytest.mark.usefixtures("prepared_model")

GOLDEN = Path(__file__).resolve().parent / "golden" / "requantized"
TYPES = sorted(p.stem for p in GOLDEN.glob("*.json"))


def golden(kind: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GOLDEN / f"{kind}.json").read_text())
    data["step0_logits"] = np.load(GOLDEN / f"{kind}.npz")["step0_logits"].astype(np.float32)
    return data


def test_the_files_people_download_are_each_covered() -> None:
    assert {"Q4_K_M", "Q5_K_M", "Q3_K_M", "Q2_K", "IQ4_XS", "BF16"} <= set(TYPES)
    held = {t for kind in TYPES for t in golden(kind)["tensor_types"]}
    # Not held: Q4_1 (SmolLM2's own file), F16, and Q2_K: llama.cpp's Q2_K mix of
    # SmolLM2 holds none (its rows of 576 fall back to Q4_0, the others go to Q3_K).
    # The synthetic goldens hold all three.
    assert {q.name for q in SUPPORTED} - held == {"Q4_1", "F16", "Q2_K"}
    for kind in TYPES:
        g = golden(kind)
        assert set(g["tensor_types"]) <= {q.name for q in SUPPORTED}, kind
        assert sum(m > 0.5 for m in g["margins"]) >= 5, kind  # steps that check tokens


@pytest.mark.parametrize("kind", TYPES)
def test_the_engine_answers_as_llama_cpp_on_real_weights(kind: str, tmp_path: Path) -> None:
    if binary("llama-quantize") is None:
        pytest.skip("llama-quantize is not built (the bench extra's vendored llama.cpp)")
    path = tmp_path / f"{kind}.gguf"
    requantize(pull("smollm2-135m", progress=lambda _line: None), kind, path)
    g = golden(kind)
    assert tensors_sha256(path) == g["tensors_sha256"], "not the file llama.cpp ran"
    if disagreements(engine(path), g) == []:
        return
    # Only where the engine falls below 0.998: how close exact arithmetic comes.
    exact = reference(LlamaStage(load_stage(path, 0, model_config(path).layers)))(g["prompt"])
    bar = min(CORRELATION, float(np.corrcoef(exact, g["step0_logits"])[0, 1]) - 0.001)
    assert disagreements(engine(path), g, bar) == []
