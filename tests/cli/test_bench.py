"""``hecate bench core`` prints the figures docs/BENCHMARKS.md is made from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hecate.cli.main import main


def test_the_core_benchmark_prints_every_figure(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    picture = tmp_path / "core.png"
    assert main(["bench", "core", "--quick", "--plot", str(picture)]) == 0
    assert picture.read_bytes()[:4] == b"\x89PNG"
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["route_us"]) == {"2x3", "8x4", "32x6"}
    assert all(set(v) == {"p50", "p99"} for v in doc["route_us"].values())
    assert set(doc["plan_ms"]) == {"100", "1000", "10000"}
    assert doc["meta"]["machine"]


def test_the_herd_benchmark_reports_every_policy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    picture = tmp_path / "herd.png"
    assert main(["bench", "herd", "--quick", "--plot", str(picture)]) == 0
    assert picture.read_bytes()[:4] == b"\x89PNG"
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["policies"]) == {
        "exact",
        "seed",
        "full",
        "decorrelated",
        "hecate",
        "hecate-queue",
    }
    assert doc["ideal_last_success_s"] == 9.0
    hecate = doc["policies"]["hecate"]
    assert hecate["attempts_per_success"] <= 1.95  # nobody is refused twice
    assert hecate["last_success_s"] <= 1.1 * doc["ideal_last_success_s"]
    assert doc["policies"]["hecate-queue"]["attempts_per_success"] <= 1.05
    assert doc["policies"]["exact"]["attempts_per_success"] > 5  # the anchor's 5.5x
