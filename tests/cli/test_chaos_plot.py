"""The chaos timeline is drawn from a scenario's record alone (no swarm needed)."""

from __future__ import annotations

from pathlib import Path

from hecate.chaos.load import Record, Sample, summarize
from hecate.chaos.plot import timeline


def test_the_timeline_is_a_png_with_every_outcome(tmp_path: Path) -> None:
    record = Record()
    record.samples = [Sample(i * 0.01, i * 0.01 + 0.004, "ok", nodes=("a",)) for i in range(300)]
    record.faults = [(1.0, "SIGKILL node a"), (2.0, "restart node a")]
    record.samples += [Sample(1.01, 1.4, "error", "unrecoverable"), Sample(1.02, 3.0, "lost")]
    result = summarize("node-kill", record)
    assert (result["errors"], result["lost"]) == (1, 1)
    assert result["recover_s"] > 0
    out = tmp_path / "img" / "timeline.png"
    timeline(record, result, out, "hecate chaos node-kill --plot timeline.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
