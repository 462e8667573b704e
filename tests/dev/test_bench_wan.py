"""``hecate bench wan``'s section of docs/BENCHMARKS.md comes from its saved result
alone: the hop and chain table at every round-trip time, and the router's preference
judged again from the counts measured, so a low share or a wrong text fails it
whatever the suite said."""

# The report is typographic prose; the tests quote it exactly.
# ruff: noqa: RUF001

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from hecate.cli.main import main
from hecate_dev.bench.report import render
from hecate_dev.bench.report.markdown import Met
from hecate_dev.bench.report.wan import judge_preference, section_wan
from hecate_dev.bench.results import load
from hecate_dev.bench.results_wan import WanPreference, WanResult
from tests.dev.bench_results import WAN, envelope, results

TITLE = "Wide-area links: SmolLM2 with every node 0 to 40 ms away"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _section(saved: dict[str, Any]) -> tuple[str, dict[str, Met]]:
    text, targets = section_wan(envelope("wan", saved), "img")
    return _flat(text), {t.what: t.met for t in targets}


def _preference(**change: Any) -> WanPreference:
    saved = load(WAN, WanResult).preference
    assert saved is not None
    return msgspec.structs.replace(saved, **change)


def test_the_saved_example_loads_and_renders_hop_against_chain_at_every_rtt() -> None:
    r = load(WAN, WanResult)
    assert [(x.dispatch, x.rtt_ms) for x in r.runs][:3] == [("hop", 0), ("hop", 20), ("hop", 40)]
    text, targets = _section(WAN)
    assert "| 0 | 17.1 | 24.7 | 1.44× | 58 | 41 |" in text
    assert "| 40 | 4.9 | 4.8 | 0.98× | 198 (+141) | 205 (+164) |" in text
    assert "14 went to the nearer pipeline, 2 to the farther" in text
    assert "at least 80 % on the nearer one: met" in text
    assert list(targets.values()) == [True, True]


def test_a_low_share_on_the_nearer_pipeline_fails_whatever_the_suite_said() -> None:
    saved = json.loads(json.dumps(WAN))
    saved["preference"] |= {"on_fast": 9, "on_slow": 7}  # "met": true stays, as saved
    text, targets = _section(saved)
    assert "at least 80 % on the nearer one: **not met**" in text
    assert targets["wan: ≥ 80 % of requests on the pipeline 40 ms RTT nearer"] is False
    assert judge_preference(_preference(on_fast=9, on_slow=7)) == (False, 0.562)


def test_a_wrong_text_fails_its_run_and_the_preference() -> None:
    saved = json.loads(json.dumps(WAN))
    saved["runs"][4] |= {"text_ok": False, "text": " Lyon"}
    saved["preference"]["text_ok"] = False
    text, targets = _section(saved)
    assert "| 20 | 6.9 | 8.4 (a wrong text) |" in text
    assert targets["wan: every generation streams the greedy text"] is False
    assert targets["wan: ≥ 80 % of requests on the pipeline 40 ms RTT nearer"] is False


@given(
    requests=st.integers(0, 50),
    data=st.data(),
    text_ok=st.booleans(),
    target=st.sampled_from([0.5, 0.8, 1.0]),
)
def test_the_verdict_is_the_measured_share_against_the_target(
    requests: int, data: st.DataObject, text_ok: bool, target: float
) -> None:
    on_fast = data.draw(st.integers(0, requests))
    p = _preference(
        requests=requests,
        on_fast=on_fast,
        on_slow=requests - on_fast,
        text_ok=text_ok,
        target_share=target,
    )
    met, share = judge_preference(p)
    if requests == 0:
        assert (met, share) == (None, None)
    else:
        assert share == round(on_fast / requests, 3)
        assert met == (text_ok and share >= target)


def test_a_skipped_run_says_why() -> None:
    text, targets = _section({"skipped": "smollm2-135m is not pulled"})
    assert "Skipped: smollm2-135m is not pulled." in text
    assert targets == {}


def test_the_report_has_the_section_and_its_targets_in_the_headline() -> None:
    doc = _flat(render(results()))
    assert f"## {TITLE}" in doc
    assert (
        "| wan: ≥ 80 % of requests on the pipeline 40 ms RTT nearer | 88 % on the nearer | met |"
        in doc
    )
    doc = _flat(render({k: v for k, v in results().items() if k != "wan"}))
    assert "Not run for this report: no saved result for `wan`" in doc


def test_the_report_command_renders_the_section_from_wan_json(tmp_path: Path) -> None:
    saved = tmp_path / "results"
    saved.mkdir()
    (saved / "wan.json").write_text(json.dumps(envelope("wan", WAN)))
    out = tmp_path / "BENCHMARKS.md"
    argv = ["bench", "report", "--results", str(saved), "--doc", str(out)]
    assert main([*argv, "--img", str(tmp_path / "img")]) == 0
    text = _flat(out.read_text())
    assert f"## {TITLE}" in text
    assert "| 20 | 6.9 | 8.4 | 1.22× | 135 (+77) | 118 (+76) |" in text
