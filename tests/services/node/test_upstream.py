"""An upstream provider behind a node: its 429 hints are read, honoured and passed on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nats.aio.client import Client

from hecate_node.upstream import UpstreamModel, UpstreamRefused
from tests.support.provider import FakeProvider, provider
from tests.support.swarm import Processes, infer, start_planner, wait_until_serving


@pytest.mark.parametrize(
    ("mode", "code", "wait"),
    [
        ("429-seconds", "rate_limited", 2.0),
        ("429-ms", "rate_limited", 1.5),
        ("429-date", "rate_limited", 3.0),
        ("429-reset-tokens", "rate_limited", 90.0),
        ("500", "upstream_error", None),
        ("400", "upstream_rejected", None),
    ],
)
async def test_the_provider_answer_is_read_with_the_hint_parser(
    mode: str, code: str, wait: float | None
) -> None:
    with provider(mode) as url:
        model = UpstreamModel(url, "gpt-test")
        with pytest.raises(UpstreamRefused) as refused:
            await model.complete("hi", 4)
        await model.close()
    assert refused.value.code == code
    if wait is None:
        assert refused.value.retry_after_s is None
    else:
        assert refused.value.retry_after_s == pytest.approx(wait, abs=1.01)


async def test_after_a_429_the_node_waits_locally_instead_of_asking_again() -> None:
    with provider("429-seconds") as url:
        model = UpstreamModel(url, "gpt-test")
        with pytest.raises(UpstreamRefused):
            await model.complete("first", 4)
        FakeProvider.mode = "ok"
        with pytest.raises(UpstreamRefused) as second:
            await model.complete("too soon", 4)
        await model.close()
    assert len(FakeProvider.requests) == 1  # the second never reached the provider
    assert second.value.code == "rate_limited"
    assert 0 < (second.value.retry_after_s or 0) <= 2.0


async def test_the_published_limit_paces_the_next_calls() -> None:
    with provider("limit-exhausted") as url:
        model = UpstreamModel(url, "gpt-test")
        assert await model.complete("one", 4) == "echo: one"
        with pytest.raises(UpstreamRefused) as paced:
            await model.complete("two", 4)
        await model.close()
    assert len(FakeProvider.requests) == 1
    assert paced.value.retry_after_s == pytest.approx(2.0, abs=0.2)
    assert model.limit_per_min == 60


async def test_a_rate_limited_upstream_reaches_the_client_as_rate_limited_with_its_wait(
    processes: Processes, client: Client, tmp_path: Path
) -> None:
    topology = tmp_path / "upstream.json"
    topology.write_text(
        json.dumps(
            {
                "models": [{"id": "gpt", "layers": 1, "role": "base", "executor": "upstream"}],
                "nodes": [{"id": "openai", "capacity_layers": 1, "executor": "upstream"}],
            }
        )
    )
    with provider("ok") as url:
        processes.start("telemetry", "telemetry", "--id", "telemetry")
        start_planner(processes, topology, 1, settle_ms=200)
        processes.start("router-1", "router", "--id", "router-1", "--topology", str(topology))
        processes.start(
            "node-openai",
            "node",
            "--id",
            "openai",
            "--capacity-layers",
            "1",
            "--executor",
            "upstream",
            "--upstream-url",
            url,
            "--upstream-model",
            "gpt-test",
        )
        ok = await wait_until_serving(client, "gpt")
        assert ok.output == "echo: ready?"
        assert FakeProvider.requests[-1]["model"] == "gpt-test"
        FakeProvider.mode = "429-ms"
        refused = await infer(client, "gpt", "please")
    assert refused.ok is False
    assert refused.error is not None
    assert refused.error.code == "rate_limited"
    assert refused.retry_after_s == pytest.approx(1.5, abs=0.1)
