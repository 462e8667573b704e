"""The link scenarios, short: every node behind a fault proxy, a steady load, and the
busiest middle node's link made silent (node-blackhole) or slow (slow-link). Each must
pass its acceptance: nothing lost or wrong, no error, its own checks (a bounded worst
caller and the node serving again; load moving off a slow link without a node-down)
and the evidence that its fault hit live traffic."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from hecate.dev.chaos.links import NodeBlackhole, SlowLink
from hecate.dev.chaos.runner import run
from hecate.dev.chaos.scenario import Scenario


@pytest.mark.parametrize("scenario", [NodeBlackhole(), SlowLink()], ids=lambda s: s.name)
async def test_a_faulty_link_costs_no_request(scenario: Scenario, tmp_path: Path) -> None:
    assert scenario.expect.evidence
    assert not scenario.expect.allowed_errors
    result = await run(scenario, short=True, workdir=tmp_path)
    # What a failure needs to be understood (pytest shortens a whole result to "...").
    seen = {
        k: v
        for k, v in msgspec.to_builtins(result).items()
        if k in ("sent", "errors", "lost", "wrong", "evidence", "checks", "notes")
    }
    assert result.sent > 100, seen  # the load really ran
    assert (result.lost, result.wrong, result.errors) == (0, 0, 0), seen
    failed = [k for k, ok in result.acceptance.items() if not ok]
    assert not failed, (failed, seen)
