"""``hecate bench gateway``: a short run on a real toy swarm with its gateway process,
the pairing of streamed tokens with their SSE chunks, the verdicts, and the report's
section, all from measured (or saved) figures alone."""

# The report is typographic prose; the tests quote it exactly.
# ruff: noqa: RUF001

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest

from hecate.cli.main import main
from hecate_dev.bench import provenance
from hecate_dev.bench.gateway_load import Http1
from hecate_dev.bench.gateway_stream import SseText, matched, tokens_per_s
from hecate_dev.bench.report import render
from hecate_dev.bench.report.gateway import judge
from hecate_dev.bench.results import load
from hecate_dev.bench.results_gateway import GatewayResult
from tests.dev.bench_results import GATEWAY, results


def _section(doc: str, title: str) -> str:
    start = doc.index(f"## {title}")
    end = doc.find("\n## ", start + 1)
    return " ".join(doc[start : end if end >= 0 else len(doc)].split())


# In make test-heavy (about 11 s): make bench runs the suite in full, and the report's
# rendering of its results is tested here without a run.
@pytest.mark.heavy
def test_a_short_run_checks_every_answer_and_renders(tmp_path: Path) -> None:
    """The toy swarm of ``make run-toy`` and ``hecate gateway --open`` as processes: a
    few requests each way, one capacity window each way, every answer checked."""
    from hecate_dev.bench.gateway import run_gateway_bench

    report = run_gateway_bench(
        samples=30, warmup=5, clients=(8,), processes=2, seconds=0.5, rounds=1, stream=False
    )
    lat = report.toy.latency
    for timed in (lat.direct_us, lat.gateway_us, lat.gateway_httpx_us):
        assert timed.samples == 30  # every answer came and was right
    assert set(lat.wrong.values()) == set(lat.failed.values()) == {0}
    cap = report.toy.capacity
    assert cap is not None
    ((direct,), (gateway,)) = (cap.direct.levels, cap.gateway.levels)
    assert direct.ok > 0
    assert gateway.ok > 0
    assert cap.wrong == 0
    assert gateway.cores["gateway"] > 0  # the gateway process did the work
    assert cap.ratio == cap.ratio_rounds[0]
    assert report.failed_checks == []
    assert report.verdicts["answers_right"] == "met"
    assert report.verdicts["stream_added_p50"] == "not measured"
    saved = tmp_path / "results"
    provenance.save(
        saved,
        "gateway",
        provenance.envelope("gateway", "hecate bench gateway", msgspec.to_builtins(report)),
    )
    doc = tmp_path / "BENCHMARKS.md"
    argv = ["bench", "report", "--results", str(saved), "--doc", str(doc)]
    assert main([*argv, "--img", str(tmp_path / "img")]) == 0
    section = _section(doc.read_text(), "The HTTP gateway")
    assert "0 wrong in this run (met)" in section
    assert "Not measured in this run: not asked for (toy model only)." in section


def test_tokens_pair_with_their_chunks_in_order_and_by_text() -> None:
    tokens = {0: (1.0, "The"), 1: (2.0, ""), 2: (3.0, " cap"), 3: (4.0, "ital")}
    chunks = [(1.25, "The"), (3.5, " cap"), (4.75, "ital")]
    assert matched(tokens, chunks) == ([0.25, 0.5, 0.75], 0)
    # A chunk that is not its token's text ends the pairing; the rest are unmatched.
    assert matched(tokens, [(1.25, "The"), (3.5, " ca"), (4.75, "pital")]) == ([0.25], 4)
    assert matched(tokens, chunks[:2]) == ([0.25, 0.5], 1)  # a token never reached the client
    assert tokens_per_s([1.0, 1.25, 1.5]) == 4.0  # two tokens after the first, in 0.5 s
    assert tokens_per_s([1.0]) == 0.0


def test_sse_text_comes_out_of_frames_however_the_bytes_are_cut() -> None:
    frames = (
        b'data: {"choices": [{"text": " Par"}]}\n\n'
        b'data: {"choices": [{"text": "is"}]}\n\n'
        b'data: {"choices": [{"text": "", "finish_reason": "stop"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    for cut in range(1, len(frames)):
        sse = SseText()
        assert sse.feed(frames[:cut]) + sse.feed(frames[cut:]) == [" Par", "is"]
    with pytest.raises(RuntimeError, match="the stream broke"):
        SseText().feed(b'data: {"error": {"message": "no node"}}\n\n')


async def test_the_minimal_client_reads_a_chunked_body_chunk_by_chunk() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(b"5\r\nhello\r\n1;ext=1\r\n!\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n")
    conn = Http1(reader, cast(asyncio.StreamWriter, None))
    assert [chunk async for chunk in conn.chunks()] == [b"hello", b"!"]
    assert await reader.readuntil(b"\r\n") == b"HTTP/1.1 200 OK\r\n"  # the next answer


def _report(**changes: Any) -> dict[str, Any]:
    report = json.loads(json.dumps(GATEWAY))
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = report
        for key in parents:
            node = node[key]
        node[leaf] = value
    return report


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, {"added_p50": True, "added_p99": True, "stream_added_p50": True}),
        ({"toy__latency__added_p50_us": 1000.1}, {"added_p50": False}),
        ({"toy__latency__added_p99_us": 5200.0}, {"added_p99": False}),
        ({"stream": {"skipped": "smollm2-135m is not pulled"}}, {"stream_added_p50": None}),
        ({"stream__added_us__p50": 650.0}, {"stream_added_p50": False}),
        # One wrong answer anywhere and no figure of the run meets its target.
        (
            {"toy__capacity__wrong": 1},
            {"added_p50": False, "added_p99": False, "answers_right": False},
        ),
        ({"stream__wrong": 2}, {"stream_added_p50": False, "answers_right": False}),
    ],
)
def test_verdicts_come_from_the_figures(
    changes: dict[str, Any], expected: dict[str, bool | None]
) -> None:
    verdicts = judge(load(_report(**changes), GatewayResult))
    for name, met in expected.items():
        assert verdicts[name] is met, name


def test_the_report_section_gives_figures_and_verdicts_from_the_saved_result() -> None:
    doc = render(results())
    section = _section(doc, "The HTTP gateway")
    assert "Command: `hecate bench gateway --results build/bench`" in section
    assert "| through the gateway, minimal HTTP/1.1 client | 1.83 | 4.10 | +0.62 | +1.15 |" in (
        section
    )
    assert "added p50 ≤ 1 ms: met (+0.62 ms); added p99 ≤ 5 ms: met (+1.15 ms)" in section
    assert "| through the gateway | 64 | 1,150 | 1,150, 1,100, 1,180 | 0.97 |" in section
    assert (
        "direct 2,420 req/s (at 256 clients, still growing: a floor), through the gateway "
        "1,150 req/s (at 64 clients). Gateway ÷ direct: **≤ 0.477×**"
    ) in section
    assert "no answer or an error: 3; a wrong answer: 0." in section
    assert "| added per token, p50 (ms) | 0.310 | 0.520 |" in section
    headline = _section(doc, "Headline")
    assert (
        "| gateway adds ≤ 1 ms at p50 over a direct NATS request (toy model) | +0.62 ms | met |"
        in headline
    )
    assert (
        "| streaming through the gateway adds ≤ 0.5 ms per token (p50, SmolLM2) "
        "| p50 0.310 ms per token | met |"
    ) in headline


def test_a_slow_gateway_and_a_skipped_stream_are_reported_as_such() -> None:
    saved = results()
    saved["gateway"]["report"] = _report(
        toy__latency__added_p50_us=1430.0,
        stream={"skipped": "smollm2-135m is not pulled (hecate model pull smollm2-135m)"},
    )
    doc = render(saved)
    section = _section(doc, "The HTTP gateway")
    assert "added p50 ≤ 1 ms: **not met** (+1.43 ms)" in section
    assert "Not measured in this run: smollm2-135m is not pulled" in section
    headline = _section(doc, "Headline")
    assert "| +1.43 ms | **not met** |" in headline
    assert "| streaming through the gateway adds ≤ 0.5 ms per token (p50, SmolLM2) " in headline
    assert "| not run | not measured |" in headline


def test_the_suite_saves_its_result_and_fails_on_a_wrong_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command's plumbing: --quick's settings reach the suite, the result is saved
    with its provenance, and a wrong answer fails the command after saving."""
    import hecate_dev.bench.gateway

    asked: list[dict[str, Any]] = []

    def wrong_once(**kwargs: Any) -> dict[str, Any]:
        asked.append(kwargs)
        return _report(failed_checks=["1 wrong answers"])

    monkeypatch.setattr(hecate_dev.bench.gateway, "run_gateway_bench", wrong_once)
    assert main(["bench", "gateway", "--quick", "--results", str(tmp_path)]) == 1
    assert asked == [hecate_dev.bench.gateway.QUICK]
    saved = json.loads((tmp_path / "gateway.json").read_text())
    assert saved["command"] == f"hecate bench gateway --quick --results {tmp_path}"
    assert saved["report"]["failed_checks"] == ["1 wrong answers"]
