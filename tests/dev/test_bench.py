"""``hecate bench core`` prints the figures docs/BENCHMARKS.md is made from."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
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
        "hecate-queue-5s",
    }
    assert doc["ideal_last_success_s"] == 9.0
    hecate = doc["policies"]["hecate"]
    assert hecate["attempts_per_success"] <= 1.95  # nobody is refused twice
    assert hecate["last_success_s"] <= 1.1 * doc["ideal_last_success_s"]
    assert doc["policies"]["hecate-queue"]["attempts_per_success"] <= 1.05
    assert doc["policies"]["hecate-queue-5s"]["attempts_per_success"] > 1.05  # late slots
    assert doc["policies"]["exact"]["attempts_per_success"] > 5  # the anchor's 5.5x


def test_a_quick_bus_sweep_runs_on_real_processes_and_renders(tmp_path: Path) -> None:
    """Raw NATS and the routed 1-stage path, closed loop and a short capacity search
    from two generator processes, on a real nats-server with a real router and node;
    then the report from it."""
    from hecate_dev.bench import provenance
    from hecate_dev.bench.bus import Sweep, run_bus_bench

    report = run_bus_bench(
        seconds=0.3,
        rounds=1,
        configurations=("raw", "routed_1"),
        sweep=Sweep(low=(0.1,), start=0.3, step=2.0, misses=1, refine=0, ceiling=0.6),
        sweep_seconds=0.3,
        generators=2,
    )
    assert report.raw is not None
    assert report.raw.requests > 0
    assert report.routed_1 is not None
    assert report.routed_1.requests > 0
    assert report.meta.ratio_basis == "open-loop capacity"
    assert report.sweep is not None
    for label in ("raw", "routed_1"):
        points = report.sweep[label]
        assert [p.offered_rps for p in points] == sorted(p.offered_rps for p in points)
        assert len(points) >= 2  # a low rate, then the climb until a miss or the ceiling
        for p in points:  # every request offered is accounted for, by both generators
            assert p.sent == p.ok + p.failed + p.timed_out > 0
            assert p.generators == 2
        assert label in report.capacity
    assert report.ratio_1_is in {"exact", "at_most", "at_least", "unknown"}
    results = tmp_path / "results"
    saved = msgspec.to_builtins(report)
    provenance.save(results, "bus", provenance.envelope("bus", "hecate bench bus", saved))
    doc, img = tmp_path / "BENCHMARKS.md", tmp_path / "img"
    assert (
        main(["bench", "report", "--results", str(results), "--doc", str(doc), "--img", str(img)])
        == 0
    )
    text = doc.read_text()
    assert "### Offered load" in text
    assert "Not run for this report: no saved result for `core`" in text
    assert (img / "bench-bus-load.png").read_bytes()[:4] == b"\x89PNG"
