"""``hecate bench types``: its files are made once and used again while their stamps
fit, its failures are worded by why, it skips without llama.cpp or the model, and its
section of docs/BENCHMARKS.md judges F16 from the ratios saved, never from one round."""

# The report is typographic prose; the tests quote it exactly.
# ruff: noqa: RUF001

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hecate.cli.main import main
from hecate_dev.bench import types
from hecate_dev.bench.report import render
from hecate_dev.bench.report.markdown import Met
from hecate_dev.bench.report.types import section_types
from hecate_dev.bench.results import load
from hecate_dev.bench.types import TypeSpeed, TypesResult
from tests.dev.bench_results import TYPES, envelope, results


def _section(report: dict[str, Any]) -> tuple[str, list[Met]]:
    text, targets = section_types(envelope("types", report), "img")
    return " ".join(text.split()), [t.met for t in targets]


def _f16(report: dict[str, Any]) -> dict[str, Any]:
    f16: dict[str, Any] = report["types"][0]
    assert f16["type"] == "F16"
    return f16


def test_the_saved_fixture_is_what_the_suite_saves() -> None:
    assert load(TYPES, TypesResult).types[0].tg_ratio == [0.95, 0.97, 0.93]


def test_the_section_tables_each_type_and_judges_f16_on_its_rounds() -> None:
    text, verdicts = _section(TYPES)
    assert "| F16 | 258 | F16 211 | 1%, 0%, 2% | 0 |" in text
    assert (
        "| F16 | 19.0, 19.4, 18.6 | 20.0, 20.0, 20.0 | 0.950, 0.970, 0.930 "
        "| 0.950 (0.930–0.970 at 75%) |"
    ) in text
    assert "| Q4_K_M | 258 | Q5_0 120, Q4_K 61, Q8_0 30 | 0%, 30%, 1% | 2 |" in text
    assert "| Q4_K_M | 80.0, 84.0, 82.0 | 100.0, 100.0, 100.0 | 0.800, 0.840, 0.820 |" in text
    assert "| Q4_K_M | 500.0, 520.0, 510.0 | 400.0, 400.0, 400.0 | 1.250, 1.300, 1.275 |" in text
    assert "* Q4_K_M: round 2 kept after 3 tries with others on 30% of the cores" in text
    assert "a round in which it passed 5% is run again, at most 2 times" in text
    assert "| IQ4_NL | - | - | - | - |" in text
    assert "| IQ4_NL | failed: llama-quantize: exit 1: unknown type | | | |" in text
    assert "* IQ4_NL failed: llama-quantize: exit 1: unknown type" in text
    assert "| Gemma 3 270M, Q4_K_M | failed: exit 1: UnsupportedModel: gemma3" in text
    assert "* Gemma 3 270M, Q4_K_M failed: exit 1: UnsupportedModel: gemma3" in text
    assert "SmolLM2-135M's own Q4_1 file re-quantised" in text
    assert "in 3 interleaved rounds" in text
    assert verdicts == [True]
    headline = " ".join(render(results()).split())
    assert (
        "| decode (tg128) on F16 ≥ 0.9× llama-bench's, same file and threads (SmolLM2 "
        "re-quantised) | 0.950× (median of 3; 0.930–0.970 holds it at 75%) | met |"
    ) in headline


@pytest.mark.parametrize(
    ("ratios", "same", "met"),
    [
        ([0.85, 0.95, 0.97], True, "undecided"),  # the interval spans 0.9
        ([0.8, 0.85, 0.89], True, False),
        ([0.95, 0.97, 0.93], False, False),  # fast, but the tokens differed
        ([1.2], True, "undecided"),  # one round: no interval to judge on
    ],
)
def test_f16_is_judged_on_its_interval_and_its_tokens(
    ratios: list[float], same: bool, met: Met
) -> None:
    report = json.loads(json.dumps(TYPES))
    _f16(report).update(tg_ratio=ratios, same_tokens=same)
    assert _section(report)[1] == [met]
    speed = TypeSpeed(type="F16", model="m", tg_ratio=ratios, same_tokens=same)
    assert types.f16_verdict([speed]) == met


def test_f16_that_failed_is_not_met_and_one_not_timed_has_no_target() -> None:
    report = json.loads(json.dumps(TYPES))
    _f16(report).update(failed="exit 1: MemoryError", tg_ratio=[])
    text, verdicts = _section(report)
    assert verdicts == [False]
    assert "* F16 failed: exit 1: MemoryError" in text
    report["types"] = report["types"][1:]
    text, verdicts = _section(report)
    assert verdicts == []
    assert "F16 was not timed in this run." in text
    assert types.f16_verdict([]) is None


def test_a_skipped_run_and_a_skipped_gemma_say_why() -> None:
    text, verdicts = _section({"skipped": "llama.cpp's llama-bench not built"})
    assert "Not measured in this run: llama.cpp's llama-bench not built." in text
    assert verdicts == []
    report = json.loads(json.dumps(TYPES))
    report["gemma"] = {"type": "-", "model": "gemma3-270m", "skipped": "gemma3-270m is absent"}
    text, _ = _section(report)
    assert "Gemma 3 270M: not measured in this run: gemma3-270m is absent." in text
    assert "| Gemma 3 270M" not in text


def test_a_failure_is_worded_by_its_status_and_last_line_not_the_command() -> None:
    script = "import sys\n" * 50
    stderr = "Traceback (most recent call last):\n  File x\nValueError: gemma3: bad tensor\n"
    exc = subprocess.CalledProcessError(1, ["python", "-c", script], "", stderr)
    assert types.why(exc) == "exit 1: ValueError: gemma3: bad tensor"
    assert types.why(subprocess.CalledProcessError(-9, ["x"])) == "exit -9"
    assert types.why(subprocess.TimeoutExpired(["llama-bench"], 1800)) == "timed out after 1800 s"
    assert types.why(ValueError("no JSON")) == "ValueError: no JSON"


def test_others_share_is_the_machine_s_busy_time_less_this_run_s() -> None:
    before = types.Sample(at=10.0, busy=100.0, ours=5.0)
    # 2 s on 2 cores: 3 s busy, 2 of them this process's and its children's
    assert types.others(before, types.Sample(at=12.0, busy=103.0, ours=7.0), 2) == 0.25
    assert types.others(before, types.Sample(at=12.0, busy=102.0, ours=7.5), 2) == 0.0
    assert types.others(before, types.Sample(at=10.0, busy=100.0, ours=5.0), 2) == 0.0
    assert 0 <= types.others(types.sample(), types.sample(), 2) <= 1  # reads this machine


def _fake_sides(
    monkeypatch: pytest.MonkeyPatch, shares: list[float], tokens: list[list[int]]
) -> list[str]:
    """Sides that give fixed figures, other processes' shares in turn and the engine's
    tokens in turn; returns the order the sides ran in."""
    ran: list[str] = []
    shares, tokens = list(shares), list(tokens)

    def side(name: str, path: Path, cores: int) -> types.Side:
        del path, cores
        ran.append(name)
        if name == "llama":
            return types.Side(200.0, 100.0, None, shares.pop(0))
        return types.Side(300.0, 90.0, tokens.pop(0), shares.pop(0))

    monkeypatch.setattr(types, "side", side)
    monkeypatch.setattr(types, "settle", lambda _cores: 1.5)
    monkeypatch.setattr(types, "matrices", lambda _path: {"Q8_0": 211})
    return ran


def test_rounds_alternate_and_a_round_others_crowded_is_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "m.gguf"
    file.write_bytes(b"x" * 2**20)
    # round 1 quiet; round 2 crowded on its first try (llama's side), quiet on its second
    shares = [0.0, 0.01, 0.3, 0.0, 0.02, 0.0]
    ran = _fake_sides(monkeypatch, shares, [[1, 2]] * 3)
    got = types.timed("Q8_0", "smollm2-135m", file, rounds=2)
    assert ran == ["engine", "llama", "llama", "engine", "llama", "engine"]
    assert got.tg_ratio == [0.9, 0.9]
    assert got.pp_ratio == [1.5, 1.5]
    assert got.others_cpu == [0.01, 0.02]
    assert (got.rerun, got.waited_s, got.same_tokens) == (1, 4.5, True)
    assert (got.file_mib, got.matrices) == (1.0, {"Q8_0": 211})
    assert types.f16_verdict([msgspec.structs.replace(got, type="F16")]) is True  # 0.9 ≥ 0.9


def test_a_round_kept_crowded_after_every_try_records_its_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "m.gguf"
    file.write_bytes(b"x")
    _fake_sides(monkeypatch, [0.4, 0.0] * 3, [[1], [1], [2]])
    got = types.timed("Q8_0", "smollm2-135m", file, rounds=1)
    assert (got.others_cpu, got.rerun, got.same_tokens) == ([0.4], 2, True)
    text, _ = _section(
        {**TYPES, "types": [msgspec.to_builtins(got) | {"type": "F16"}], "gemma": None}
    )
    assert "* F16: round 1 kept after 3 tries with others on 40% of the cores" in text


def test_an_engine_that_fails_is_recorded_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "m.gguf"
    file.write_bytes(b"x")

    def side(name: str, path: Path, cores: int) -> types.Side:
        del name, path, cores
        raise subprocess.CalledProcessError(1, ["python"], "", "boom\nNameError: x\n")

    monkeypatch.setattr(types, "side", side)
    monkeypatch.setattr(types, "settle", lambda _cores: 0.0)
    monkeypatch.setattr(types, "matrices", lambda _path: {})
    got = types.timed("BF16", "smollm2-135m", file, rounds=3)
    assert got.failed == "exit 1: NameError: x"
    assert got.tg_ratio == []


def test_a_file_s_type_is_read_from_its_name() -> None:
    assert types.file_type(Path("/x/gemma-3-270m-q4_k_m.gguf")) == "Q4_K_M"
    assert types.file_type(Path("model.Q8_0.gguf")) == "Q8_0"
    assert types.file_type(Path("model-bf16.gguf")) == "BF16"
    assert types.file_type(Path("model.gguf")) == "-"


def test_a_made_file_is_used_again_while_its_stamp_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls"
    quantizer = tmp_path / "llama-quantize"
    # argv: --allow-requantize SRC OUT TYPE THREADS; writes OUT, one line per call
    quantizer.write_text(f'#!/bin/sh\necho "$4" >> {log}\nprintf "%s" "$4" > "$3"\n')
    quantizer.chmod(0o755)
    monkeypatch.setattr(types, "binary", lambda _name: quantizer)
    source = tmp_path / "smollm2.gguf"
    source.write_bytes(b"weights")
    folder = tmp_path / "types"
    assert types.made(source, "Q4_1", folder) == source  # its own type: not quantised
    out = types.made(source, "Q8_0", folder)
    assert out == folder / "smollm2-135m-Q8_0.gguf"
    assert out.read_text() == "Q8_0"
    assert types.made(source, "Q8_0", folder) == out
    assert log.read_text().split() == ["Q8_0"]  # made once
    out.write_text("cut short")  # not the size it was written at
    types.made(source, "Q8_0", folder)
    source.write_bytes(b"other weights")  # another source
    types.made(source, "Q8_0", folder)
    assert log.read_text().split() == ["Q8_0"] * 3
    assert not list(folder.glob("*.part"))


def test_stamps_fit_only_what_was_asked_at_the_size_written() -> None:
    asked = {"source": "a.gguf", "source_bytes": 7, "type": "Q8_0", "quantizer": "q"}
    assert types.fits(asked | {"bytes": 10}, asked, 10)
    assert not types.fits(asked | {"bytes": 10}, asked, 11)
    assert not types.fits(asked | {"bytes": 10, "type": "Q6_K"}, asked, 10)
    assert not types.fits({}, asked, 10)


def test_without_llama_cpp_or_the_model_the_suite_is_saved_as_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(types, "binary", lambda _name: None)
    assert main(["bench", "types", "--quick", "--results", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "types.json").read_text())["report"]
    assert saved["skipped"] == (
        "llama.cpp's llama-bench and llama-quantize not built (or set HECATE_LLAMA_CPP_BIN)"
    )
    monkeypatch.setattr(types, "binary", lambda _name: Path("/bin/true"))
    monkeypatch.setattr("hecate.llm.store.present", lambda _name: False)
    result = types.run(quick=True, if_present=True)
    assert result.skipped == "smollm2-135m is not pulled (hecate model pull smollm2-135m)"
