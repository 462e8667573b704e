"""Benchmark results are typed: what a suite returns is what the report reads back from
the saved JSON, and a shape that drifted fails at the decode, naming the field."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from hecate_dev.bench.results import (
    BreakerMeta,
    BreakerResult,
    HerdResult,
    Result,
    Spread,
    load,
)
from hecate_dev.bench.results_bus import BusResult
from hecate_dev.bench.results_gateway import GatewayResult
from hecate_dev.bench.results_llm import LlmResult
from hecate_dev.chaos import results as chaos_results
from tests.dev.bench_results import BREAKER, BUS, CHAOS, GATEWAY, HERD, LLM


def test_a_breaker_result_reads_back_from_its_saved_json() -> None:
    result = BreakerResult(
        open_seen_ms=Spread(p50=5.0, p99=7.5, max=9.0, samples=30, expected=30),
        open_reject_us=0.2,
        meta=BreakerMeta(watchers=3, trips=10, python="3.11", machine="x", date="2026-11-30"),
    )
    saved = msgspec.json.decode(msgspec.json.encode(result))
    assert load(saved, BreakerResult) == result


def test_results_saved_before_the_types_still_load() -> None:
    result = load(BREAKER, BreakerResult)
    assert result.open_seen_ms.samples == 150
    assert result.meta.date == ""


def test_a_misnamed_field_fails_with_its_path() -> None:
    seen = {"p50": 5.0, "p99": 7.5, "max": 9.0, "count": 30, "expected": 30}  # not samples
    drifted = {**BREAKER, "open_seen_ms": seen}
    with pytest.raises(msgspec.ValidationError, match=r"samples.*open_seen_ms"):
        load(drifted, BreakerResult)


# Every suite's saved shape (the fixtures are shaped as the suites saved them before
# their results were typed) reads back as its struct, and the struct saves as it reads.
SAVED: list[tuple[dict[str, Any], type[Result]]] = [
    (BUS, BusResult),
    (HERD, HerdResult),
    (GATEWAY, GatewayResult),
    (LLM, LlmResult),
]


@pytest.mark.parametrize(("saved", "kind"), SAVED, ids=lambda x: getattr(x, "__name__", ""))
def test_every_suite_s_results_saved_before_the_types_load_and_round_trip(
    saved: dict[str, Any], kind: type[Result]
) -> None:
    result = load(saved, kind)
    assert load(msgspec.to_builtins(result), kind) == result


def test_a_bus_result_names_its_configurations_and_ratios() -> None:
    bus = load(BUS, BusResult)
    raw = bus.closed("raw")
    assert raw is not None
    assert raw.rps == 26000.0
    secure = bus.closed("routed_1_secure")
    assert secure is not None
    assert secure.rps == 9000.0
    assert bus.ratio("ratio_1") == (0.28, "exact")
    assert bus.ratio("secure_over_open") == (0.85, "exact")
    with pytest.raises(KeyError):
        bus.closed("meta")


def test_a_skipped_llm_run_is_a_result_too() -> None:
    skipped = LlmResult(skipped="smollm2-135m is not pulled")
    assert msgspec.to_builtins(skipped) == {"skipped": "smollm2-135m is not pulled"}


def test_a_chaos_run_reads_back_in_order_with_its_skipped_scenarios() -> None:
    run = chaos_results.load(CHAOS)
    assert [s.scenario for s in run.scenarios] == [
        "node-kill",
        "sick-node",
        "nats-restart",
        "llm-kill",
    ]
    assert [s.scenario for s in run.skipped] == ["llm-kill"]
    assert run.ran[0].timeline is not None
    assert run.ran[1].seen()["failover_events"] == 4.0  # kept among the notes then
