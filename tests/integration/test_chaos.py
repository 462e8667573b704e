"""The chaos scenarios, short: real processes and a real nats-server, a steady load,
and a fault in the middle. Nothing may be lost or wrong, and none of these faults is
one where the spec allows an explicit error. ``make chaos`` runs the long versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from hecate.chaos.scenarios import SCENARIOS, run


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n != "llm-kill"])
async def test_the_swarm_loses_nothing_and_answers_right(name: str, tmp_path: Path) -> None:
    result = await run(name, short=True, workdir=tmp_path)
    assert result["sent"] > 100, result  # the load really ran
    assert (result["lost"], result["wrong"], result["errors"]) == (0, 0, 0), result
    assert all(result["checks"].values()), result
