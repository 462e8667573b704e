"""The chaos timeline and line of figures come from a scenario's record alone (no swarm
needed)."""

from __future__ import annotations

import json
from pathlib import Path

from hecate_dev.chaos.cli import _line
from hecate_dev.chaos.load import Record, Sample, summarize
from hecate_dev.chaos.plot import record_of, timeline, timeline_doc
from hecate_dev.chaos.results import ScenarioResult
from hecate_dev.chaos.scenarios import SCENARIOS, figures


def _result(record: Record) -> ScenarioResult:
    return SCENARIOS["node-kill"].result(record)


def test_the_timeline_is_a_png_with_every_outcome(tmp_path: Path) -> None:
    record = Record()
    record.samples = [Sample(i * 0.01, i * 0.01 + 0.004, "ok", nodes=("a",)) for i in range(300)]
    record.faults = [(1.0, "SIGKILL node a"), (2.0, "restart node a")]
    record.samples += [Sample(1.01, 1.4, "error", "unrecoverable"), Sample(1.02, 3.0, "lost")]
    summary = summarize("node-kill", record)
    assert (summary["errors"], summary["lost"]) == (1, 1)
    result = _result(record)
    assert result.recover_s > 0
    out = tmp_path / "img" / "timeline.png"
    timeline(record, result, out, "hecate chaos node-kill --plot timeline.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_saved_timeline_draws_the_same_points(tmp_path: Path) -> None:
    record = Record()
    record.faults = [(100.0, "SIGKILL node a"), (101.5, "restart node a")]
    record.samples = [Sample(99.0 + i * 0.01, 99.0 + i * 0.01 + 0.004, "ok") for i in range(300)]
    record.samples.append(Sample(100.01, 100.5, "error", "unrecoverable"))
    doc = json.loads(json.dumps(timeline_doc(record)))  # as saved and read back
    assert doc["faults"][0] == [0.0, "SIGKILL node a"]  # seconds from the first fault
    again = record_of(doc)
    assert [s.status for s in again.samples] == [s.status for s in record.samples]
    assert abs(again.samples[-1].latency_ms - 490.0) < 0.01
    result = _result(again)
    assert result.errors == 1
    out = tmp_path / "timeline.png"
    timeline(again, result, out, "hecate chaos node-kill --results build/bench")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_the_line_of_figures_names_degraded_answers_and_each_failed_criterion() -> None:
    record = Record(pipelines=[("a0", "a1", "a2"), ("b0", "b1", "b2")])
    record.faults = [(1.0, "SIGKILL node a1"), (2.0, "restart node a1")]
    record.impaired = {"a1": 1.0}
    record.samples = [Sample(i * 0.01, i * 0.01 + 0.004, "ok", nodes=("a1",)) for i in range(300)]
    record.samples += [
        Sample(1.01, 1.02, "ok", nodes=("spare",), degraded=True),  # b0-b2 were intact
        Sample(1.02, 3.0, "lost", "client_breaker_open", sends=2),
    ]
    result = figures("node-kill", record)  # no failover event was seen
    line = _line(result)
    assert "degraded=1" in line
    assert "lost: client_breaker_open=1" in line
    assert "expects: failover_events" in line
    assert line.endswith(
        "FAILED: nothing_lost, no_degraded_answer_beside_an_intact_pipeline, shows_failover_events"
    )
    shown = json.loads(json.dumps(result.figures()))  # what --json prints and --results saves
    assert shown["degraded_while_intact"] == 1
    assert shown["acceptance"]["shows_failover_events"] is False
