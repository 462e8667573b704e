"""``hecate bench core`` prints the figures docs/BENCHMARKS.md is made from."""

from __future__ import annotations

import json

import pytest

from hecate.cli.main import main


def test_the_core_benchmark_prints_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "core", "--quick"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["route_us"]) == {"2x3", "8x4", "32x6"}
    assert all(set(v) == {"p50", "p99"} for v in doc["route_us"].values())
    assert set(doc["plan_ms"]) == {"100", "1000", "10000"}
    assert doc["meta"]["machine"]
