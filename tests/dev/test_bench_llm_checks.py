"""The model benchmark checks the text it times: a run with the wrong text is saved,
reported as failed (not as fast) and fails the command; a missing llama.cpp reference
is reported as skipped, with no verdict against it."""

# The report is typographic prose; the tests quote it exactly.
# ruff: noqa: RUF001

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from hecate.cli.main import main
from hecate_dev.bench.llm import check_text, failed_checks
from hecate_dev.bench.report import render
from tests.dev.bench_results import results


def _section(doc: str, title: str) -> str:
    start = doc.index(f"## {title}")
    end = doc.find("\n## ", start + 1)
    return " ".join(doc[start : end if end >= 0 else len(doc)].split())


def _run(tokens_per_s: float = 30.0, **extra: Any) -> dict[str, Any]:
    return {"ttft_ms": 100.0, "tokens_per_s": tokens_per_s, **extra}


def test_a_run_is_judged_by_the_text_it_produced_and_streamed() -> None:
    assert check_text(_run(text=" Paris"), " Paris") == _run(text_ok=True)
    wrong = check_text(_run(text=" Paris", streamed_text=" Lyon"), " Paris")
    assert wrong["text_ok"] is False
    assert wrong["streamed_text"] == " Lyon"  # kept, to be read
    result = {
        "single": _run(text_ok=True),
        "stages_3": _run(text_ok=True),
        "kill_mid_step": _run(text_ok=False),
        "rounds": [
            {"single": _run(text_ok=True), "stages_3": _run(text_ok=True)},
            {"single": _run(text_ok=True), "stages_3": _run(text_ok=False)},
        ],
        "meta": {"tokens": 48},
    }
    assert failed_checks(result) == [
        "kill_mid_step: wrong text",
        "stages_3 (round 2): wrong text",
    ]


def _with_llm(**report: Any) -> dict[str, Any]:
    out = results()
    out["llm"]["report"] = {**copy.deepcopy(out["llm"]["report"]), **report}
    return out


def test_a_run_with_the_wrong_text_is_reported_as_failed_not_fast() -> None:
    llm = results()["llm"]["report"]
    kill = {**llm["kill_mid_step"], "text_ok": False, "text": " Lyon"}
    rounds = [{"single": {**llm["single"], "text_ok": True}, "stages_3": llm["stages_3"]}]
    rounds[0]["stages_3"] = {**llm["stages_3"], "text_ok": False}
    doc = render(
        _with_llm(
            kill_mid_step=kill,
            rounds=rounds,
            failed_checks=["kill_mid_step: wrong text", "stages_3 (round 1): wrong text"],
        )
    )
    section = _section(doc, "SmolLM2-135M")
    assert "| kill ~40 % into the next step: longest gap (ms), how | failed: wrong text |" in (
        section
    )
    assert "every timed generation gives the single-process text**: **not met**" in section
    headline = _section(doc, "Headline")
    assert (
        "| 3 stages ≥ 0.9× single process, every core (tokens/s) | failed: wrong text "
        "| **not met** |"
    ) in headline
    assert (
        "| 3 stages ≥ 0.9× single process on a stage's one thread (tokens/s) "
        "| failed: wrong text | **not met** |"
    ) in headline
    assert "| a kill stalls the stream < 1.5 s | failed: wrong text | **not met** |" in headline


def test_every_text_right_is_a_verdict_that_is_met() -> None:
    headline = _section(render(_with_llm(failed_checks=[])), "Headline")
    assert "| every timed generation gives the single-process text | all equal | met |" in (
        headline
    )


def test_without_llama_cpp_the_reference_is_skipped_with_its_reason_and_no_verdict() -> None:
    why = (
        "llama-cpp-python not installed (pip install './devtools[bench]'): "
        "No module named 'llama_cpp'"
    )
    doc = render(_with_llm(llama_cpp={"skipped": why}))
    section = _section(doc, "SmolLM2-135M")
    assert f"| llama.cpp, 2 threads | skipped: {why} |" in section
    assert "llama.cpp reference: skipped (llama-cpp-python not installed" in section
    assert "single process ≥ 1.0× llama.cpp**: not measured" in section
    assert f"| single process ≥ 1.0× llama.cpp | {why} | not measured |" in _section(
        doc, "Headline"
    )


def test_the_llama_cpp_version_build_and_rounds_are_printed() -> None:
    info = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 0 | OPENMP = 1 |"
    llama = {"version": "0.3.36", "system_info": info, "threads": 2}
    doc = render(
        _with_llm(
            llama_cpp={**llama, **_run(120.0), "matches_numpy_text": True},
            ratio_single_llama_cpp_rounds=[0.29, 0.31, 0.30],
            ratio_single_llama_cpp=0.30,
        )
    )
    section = _section(doc, "SmolLM2-135M")
    assert "| llama.cpp 0.3.36, 2 threads (median round) | 100.0 / 120.0 |" in section
    assert "built with SSE3, AVX, AVX2, OPENMP)" in section
    assert "| single process ÷ llama.cpp, median round (range) | 0.300 (0.290–0.310) |" in (section)
    assert (
        "single process ≥ 1.0× llama.cpp**: **not met** (0.300× (median of 3; "
        "0.290–0.310 holds it at 75%))"
    ) in section


def test_a_suite_with_a_failed_check_is_saved_and_fails_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hecate_dev.bench.llm

    figures = {"failed_checks": ["stages_2: wrong text"], "stages_2": _run(text_ok=False)}
    monkeypatch.setattr(hecate_dev.bench.llm, "run_llm_bench", lambda **_kw: figures)
    assert main(["bench", "llm", "--quick", "--results", str(tmp_path)]) == 1
    saved = json.loads((tmp_path / "llm.json").read_text())
    assert saved["report"]["failed_checks"] == ["stages_2: wrong text"]
