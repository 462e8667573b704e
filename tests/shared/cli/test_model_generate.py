"""``hecate model generate``: greedy text in one process, on the nodes' engine by default
and on the float32 numpy model with ``--reference``; either way the text the swarm is
held to (:func:`hecate.llm.reference.greedy_text` on the same engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gguf import GGMLQuantizationType as Q

from hecate.cli.main import main
from hecate.llm import reference
from hecate.llm.llama import LlamaStage
from hecate.llm.onnx_stage import OnnxStage
from hecate.llm.reference import greedy_text
from hecate.llm.store import add
from hecate_dev.synthetic_gguf import Shape, spm_vocabulary, write

PROMPT = "Once upon a time"
TOKENS = 12


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Float32 weights: the engine's products are then float32 too, and its greedy text
    the numpy model's (on quantised weights its int8 activations may part from it)."""
    path = tmp_path_factory.mktemp("gen") / "tiny.gguf"
    return write(path, Q.F32, Shape(layers=2, context=128), floats=True, tokenizer=spm_vocabulary())


@pytest.fixture
def tiny(model_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``model_file`` registered as ``tiny`` in a model cache of its own."""
    monkeypatch.setenv("HECATE_MODELS", str(tmp_path / "models"))
    add("tiny", model_file, progress=lambda _line: None)
    return model_file


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The whole models the command builds, as it builds them."""
    stages: list[Any] = []
    whole_model = reference.whole_model

    def spy(*args: Any, **kwargs: Any) -> Any:
        stages.append(whole_model(*args, **kwargs))
        return stages[-1]

    monkeypatch.setattr(reference, "whole_model", spy)
    return stages


def _generate(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[str, str]:
    code = main(["model", "generate", "tiny", PROMPT, "--max-tokens", str(TOKENS), *flags])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


@pytest.mark.usefixtures("tiny")
def test_it_runs_the_engine_and_gives_the_swarm_s_text(
    built: list[Any], model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, err = _generate(capsys)
    assert [type(s) for s in built] == [OnnxStage]
    assert out.removesuffix("\n") == greedy_text(model_file, PROMPT, TOKENS)
    assert err.rstrip().splitlines()[-1].endswith("(single process, greedy, on the engine)")


@pytest.mark.usefixtures("tiny")
def test_reference_runs_the_numpy_model_and_gives_its_text(
    built: list[Any], model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, err = _generate(capsys, "--reference")
    assert [type(s) for s in built] == [LlamaStage]
    assert out.removesuffix("\n") == greedy_text(model_file, PROMPT, TOKENS, engine="numpy")
    assert "on the float32 numpy reference" in err


@pytest.mark.usefixtures("tiny", "built")
def test_on_float32_weights_both_give_the_same_greedy_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    engine, _ = _generate(capsys)
    numpy, _ = _generate(capsys, "--reference")
    assert engine == numpy
    assert len(engine.strip()) > 0


@pytest.mark.usefixtures("tiny")
def test_a_generation_past_the_context_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["model", "generate", "tiny", PROMPT, "--max-tokens", "200"])
    err = capsys.readouterr().err
    assert code == 2
    (line,) = err.splitlines()
    assert line.startswith("hecate: error: a prompt of ")
    assert line.endswith(" tokens and --max-tokens 200 exceed tiny's context of 128 positions")
