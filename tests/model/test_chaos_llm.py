"""The real-model chaos scenario, short: SmolLM2 on two 3-stage pipelines, two callers
generating greedily, the middle node of the busiest pipeline SIGKILLed mid-generation
and restarted. Every text must equal the single-process greedy text, and the kill must
have hit a generation (failovers)."""

from __future__ import annotations

from pathlib import Path

from hecate.chaos.scenarios import available, run


async def test_a_mid_generation_kill_loses_nothing_and_changes_no_text(tmp_path: Path) -> None:
    assert available("llm-kill")  # the conftest pulled the model
    result = await run("llm-kill", short=True, workdir=tmp_path)
    assert result["sent"] >= 4, result
    assert (result["lost"], result["wrong"], result["errors"]) == (0, 0, 0), result
    failed = [k for k, ok in result["acceptance"].items() if not ok]
    assert not failed, (failed, result)
