"""Each chaos scenario is one object: it names itself, judges its figures and explains
them, saying why the run passed or failed. No swarm needed: the figures come from a
record made by hand."""

from __future__ import annotations

import json

import msgspec
import pytest

from hecate_dev.chaos import results
from hecate_dev.chaos.load import Record, Sample
from hecate_dev.chaos.scenario import Unknown
from hecate_dev.chaos.scenarios import SCENARIOS, of


def _record(lost: int = 0) -> Record:
    record = Record(pipelines=[("a0", "a1", "a2"), ("b0", "b1", "b2")])
    record.faults = [(1.0, "SIGKILL node a1"), (2.0, "restart node a1")]
    record.impaired = {"a1": 1.0}
    record.samples = [Sample(i * 0.01, i * 0.01 + 0.004, "ok", nodes=("b1",)) for i in range(300)]
    record.samples += [Sample(1.02, 3.0, "lost", "timeout", sends=2)] * lost
    record.failover_events = 3
    record.outages = [(1.0, 2.0)]
    return record


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_scenario_is_named_by_its_key_and_explains_a_pass(name: str) -> None:
    scenario = SCENARIOS[name]
    assert scenario.name == name
    result = scenario.result(_record())
    assert result.scenario == name
    assert result.accepted == all(scenario.accept(result).values())
    line = scenario.explain(result)
    assert line.endswith(".")
    if result.accepted:
        assert "Accepted" in line
    else:
        assert "Failed" in line


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_scenario_explains_a_failure_by_its_criterion(name: str) -> None:
    scenario = SCENARIOS[name]
    result = scenario.result(_record(lost=1))
    assert not result.accepted
    assert "Failed, criteria not met: nothing lost" in scenario.explain(result)


def test_a_result_saved_and_read_back_is_the_same_struct() -> None:
    result = SCENARIOS["node-kill"].result(_record())
    report = results.ChaosResult(scenarios=[result, results.Skipped(scenario="x", skipped="why")])
    again = results.load(json.loads(msgspec.json.encode(report)))
    assert again.ran == [result]
    assert [s.scenario for s in again.skipped] == ["x"]


def test_an_older_saved_scenario_loads_with_its_failovers_among_the_notes() -> None:
    old = {
        "scenario": "node-kill",
        "sent": 10,
        "ok": 10,
        "errors": 0,
        "lost": 0,
        "wrong": 0,
        "p99_ms": 1.0,
        "max_ms": 2.0,
        "recover_s": 0.0,
        "notes": {"failover_events": 2.0},
    }
    loaded = results.load({"scenarios": [old]}).ran[0]
    assert loaded.seen()["failover_events"] == 2.0
    assert all(of("node-kill").accept(loaded).values())


def test_a_scenario_this_hecate_no_longer_has_judges_only_loss_and_errors() -> None:
    gone = of("retired-scenario")
    assert isinstance(gone, Unknown)
    assert gone.expect.evidence == ()
