"""Benchmark results are typed: what a suite returns is what the report reads back from
the saved JSON, and a shape that drifted fails at the decode, naming the field."""

from __future__ import annotations

import msgspec
import pytest

from hecate.dev.bench.results import BreakerMeta, BreakerResult, Spread, load
from tests.cli.bench_results import BREAKER


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
