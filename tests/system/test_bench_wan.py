"""``hecate bench wan`` for real, short: every node behind its own fault proxy, the
3-stage swarm under hop and chain dispatch at two round-trip times and the two-pipeline
preference, every generation the single-process greedy text."""

from __future__ import annotations

import pytest

from hecate_dev.bench.wan import FAR_PIPELINE, NEAR_PIPELINE, run_wan_bench

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")


@pytest.mark.heavy
def test_a_short_wan_run_times_checked_generations_and_counts_the_routes() -> None:
    r = run_wan_bench(
        tokens=3, rounds=1, rtts=(0.0, 20.0), requests=2, warmup=1, preference_tokens=2
    )
    assert r.failed_checks == [], r
    assert sorted((x.dispatch, x.rtt_ms) for x in r.runs) == [
        ("chain", 0.0),
        ("chain", 20.0),
        ("hop", 0.0),
        ("hop", 20.0),
    ]
    assert all(x.text_ok and x.tokens_per_s > 0 for x in r.runs)
    p = r.preference
    assert p is not None
    assert (p.slow_pipeline, p.fast_pipeline) == (FAR_PIPELINE, NEAR_PIPELINE)
    assert p.on_fast + p.on_slow == p.requests == 2  # every reply named one of the two
    assert p.met == (p.on_fast / 2 >= p.target_share)
