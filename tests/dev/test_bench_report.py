"""docs/BENCHMARKS.md is rendered from saved results alone: every figure in it comes
from them, every target is judged from them, and a suite that did not run says so."""

# The report is typographic prose; the tests quote it exactly.
# ruff: noqa: RUF001

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hecate.cli.main import main
from hecate_dev.bench.report import (
    FIGURES_END,
    FIGURES_START,
    SUITES,
    MarkersError,
    figures,
    render,
    splice,
)
from tests.dev.bench_results import results


def _section(doc: str, title: str) -> str:
    """One section, its lines joined (prose is refilled to the margin, so a phrase may
    be split over two lines)."""
    start = doc.index(f"## {title}")
    end = doc.find("\n## ", start + 1)
    return " ".join(doc[start : end if end >= 0 else len(doc)].split())


def test_every_section_names_its_run_and_links_its_pictures() -> None:
    doc = render(results(), img="pictures")
    for _suite, title, _command, _section_fn in SUITES:
        section = _section(doc, title)
        assert "Commit: `abc1234`" in section, title
        assert "Date: 2026-01-02" in section, title
        assert "x86_64 Test CPU, 2 cores" in section, title
        assert "Command: `hecate " in section, title
    for picture in ("bench-core", "bench-bus-load", "bench-herd", "bench-scale", "chaos-node-kill"):
        assert f"(pictures/{picture}.png)" in doc
    assert "chaos-llm-kill.png" not in doc  # it was skipped: nothing to draw
    assert render(results(), img="pictures") == doc  # pure: same results, same text


def test_figures_and_verdicts_come_from_the_results() -> None:
    doc = render(results())
    core = _section(doc, "Swarm core")
    assert "| 8 × 4 | 0.62 | 1.10 | 0.20 | 3.1 |" in core
    assert (
        "met (p50 0.62 µs idle, 2.10 µs with requests in flight, a margin of 2.4x on the slower)"
        in core
    )
    bus = _section(doc, "The bus")
    assert "| routed, 1 stage (router calls the stage) | 10,920 | 2,400 | 4,800 |" in bus
    assert "as a ratio of capacities): **not met** (0.280× raw; raw NATS 39,000 req/s" in bus
    assert "| routed, 1 stage (router calls the stage) | 10,920 | 13,650 | 0.41 | **0.28** |" in (
        bus
    )
    assert "at least 99% of the requests offered got a correct reply within 2.0 s" in bus
    assert "p99 from the scheduled send is at most 100 ms" in bus
    # The open-loop table: an overloaded point with timeouts shows p99 at the bound.
    assert "| 48,750 | 39,000 | 1.12 | ≥ 2,000 | 0 | 7 | 0.41 | **no** |" in bus
    breaker = _section(doc, "Shared circuit breakers")
    assert "**not met**, the slowest of 150 samples 61.20 ms" in breaker
    chaos = _section(doc, "Chaos")
    assert "| nats-restart | 10,146 | 10,146 | 0 | 0 | 0 | 2 |" in chaos
    assert "**not met** in 2 of 3 scenarios run" in chaos
    assert "`llm-kill`: not run, its model is not pulled" in chaos
    assert "went from 0.533 to 0.123" in chaos
    headline = _section(doc, "Headline")
    assert (
        "| routed 1-stage capacity ≥ 0.4× raw NATS capacity (open loop) "
        "| 0.280× raw | **not met** |"
    ) in headline
    assert "| breaker: every router sees an OPEN ≤ 50 ms | max 61.20 ms | **not met** |" in (
        headline
    )
    assert (
        "| 3 stages ≥ 0.9× single process, every core (tokens/s) | 0.838× (median of 3; "
        "0.788–0.883 holds it at 75%) | **not met** |"
    ) in headline
    # Rounds of 0.871, 0.912 and 0.953 span the 0.9 target: the median alone would say met.
    assert (
        "| 3 stages ≥ 0.9× single process on a stage's one thread (tokens/s) | 0.912× "
        "(median of 3; 0.871–0.953 holds it at 75%) | undecided |"
    ) in headline
    assert "| single process ≥ 1.0× llama.cpp | llama-cpp-python not installed |" in headline


def test_the_held_herd_verdict_is_judged_on_the_simulated_figure() -> None:
    herd = _section(render(results()), "A thundering herd")
    assert "`hecate-queue` ≤ 1.05: met" in herd
    assert "the 400 whose slot is later are refused" in herd
    assert "1.40 attempts per success" in herd
    late = results()
    late["herd"]["report"]["policies"]["hecate-queue"].update(attempts_per_success=1.4)
    doc = render(late)
    assert "`hecate-queue` ≤ 1.05: **not met**" in _section(doc, "A thundering herd")
    assert (
        "| herd (simulated): `hecate-queue` ≤ 1.05 attempts per success | 1.40 attempts | "
        "**not met** |" in (_section(doc, "Headline"))
    )


@pytest.mark.parametrize(
    ("value", "kind", "shown", "verdict"),
    [
        (0.42, "exact", "0.420× raw", "met"),
        (0.28, "exact", "0.280× raw", "**not met**"),
        (0.28, "at_most", "≤ 0.280× raw", "**not met**"),  # raw's capacity only a floor
        (0.45, "at_most", "≤ 0.450× raw", "not measured"),  # could be below the target
        (0.45, "at_least", "≥ 0.450× raw", "met"),
        (0.30, "at_least", "≥ 0.300× raw", "not measured"),
        (0.30, "unknown", "? 0.300× raw", "not measured"),
    ],
)
def test_the_bus_verdict_follows_what_the_ratio_is(
    value: float, kind: str, shown: str, verdict: str
) -> None:
    saved = results()
    saved["bus"]["report"].update(ratio_1=value, ratio_1_is=kind)
    headline = _section(render(saved), "Headline")
    assert (
        f"| routed 1-stage capacity ≥ 0.4× raw NATS capacity (open loop) | {shown} | {verdict} |"
        in (headline)
    )


def test_a_generator_that_lagged_where_raw_failed_makes_raw_a_floor() -> None:
    saved = results()
    saved["bus"]["report"]["capacity"]["raw"]["send_lag_p99_us_at_failure"] = 80_000.0
    saved["bus"]["report"]["capacity"]["raw"]["exact"] = False
    bus = _section(render(saved), "The bus")
    assert (
        "| raw NATS request/reply (echo) | ≥ 39,000 | 48,750 | 80.00 (generators lagging) | 1 |"
        in (bus)
    )


def test_the_routing_decision_is_judged_loaded_as_well_as_idle() -> None:
    headline = _section(render(results()), "Headline")
    assert (
        "| routing decision at 8 × 4 ≤ 5 µs, idle and loaded "
        "| p50 0.62 µs idle, 2.10 µs with requests in flight | met |"
    ) in headline
    slow = results()
    slow["core"]["report"]["route_inflight_us"]["8x4"] = {"p50": 6.5, "p99": 9.0}
    headline = _section(render(slow), "Headline")
    assert "| p50 0.62 µs idle, 6.50 µs with requests in flight | **not met** |" in headline


def test_a_suite_that_did_not_run_says_so() -> None:
    doc = render(results(llm=False))
    llm = _section(doc, "SmolLM2-135M")
    assert "Not run for this report: no saved result for `llm`" in llm
    assert "hecate bench llm --results build/bench" in llm
    skipped = results()
    skipped["llm"]["report"] = {"skipped": "smollm2-135m is not pulled"}
    llm = _section(render(skipped), "SmolLM2-135M")
    assert "Not measured in this run: smollm2-135m is not pulled." in llm
    headline = _section(render(skipped), "Headline")
    assert "| a kill stalls the stream < 1.5 s | not run | not measured |" in headline


def test_no_line_of_prose_runs_past_the_margin() -> None:
    for line in render(results()).splitlines():
        if not line.startswith(("|", "![", "#")) and not re.search(r"`[^`]{60,}`", line):
            assert len(line) <= 88, line


def test_the_report_command_draws_every_picture_it_links(tmp_path: Path) -> None:
    saved = tmp_path / "results"
    saved.mkdir()
    for suite, doc in results().items():
        (saved / f"{suite}.json").write_text(json.dumps(doc))
    out = tmp_path / "docs" / "BENCHMARKS.md"
    img = tmp_path / "docs" / "img"
    img.mkdir(parents=True)
    (img / "chaos-llm-kill.png").write_bytes(b"an earlier run's picture")  # skipped now
    assert (
        main(["bench", "report", "--results", str(saved), "--doc", str(out), "--img", str(img)])
        == 0
    )
    text = out.read_text()
    linked = re.findall(r"\]\(img/([\w-]+\.png)\)", text)
    assert sorted(set(linked)) == sorted(p.name for p in img.iterdir())
    assert all((img / name).read_bytes()[:4] == b"\x89PNG" for name in linked)


def test_the_report_command_refuses_a_missing_folder(tmp_path: Path) -> None:
    assert main(["bench", "report", "--results", str(tmp_path / "none")]) == 2


def test_a_chaos_scenario_that_cannot_run_is_saved_as_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hecate_dev.chaos.scenarios

    monkeypatch.setattr(hecate_dev.chaos.scenarios, "available", lambda _name: False)
    assert main(["chaos", "llm-kill", "--results", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "chaos.json").read_text())
    assert saved["command"] == "hecate chaos llm-kill --results " + str(tmp_path)
    assert saved["report"]["scenarios"][0]["scenario"] == "llm-kill"
    assert "not pulled" in saved["report"]["scenarios"][0]["skipped"]
    chaos = _section(render({"chaos": saved}), "Chaos")
    assert "`llm-kill`: not run, its model is not pulled" in chaos


def test_a_suite_that_failed_is_saved_and_reported_as_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hecate_dev.bench.herd

    def broken(**_kwargs: object) -> dict[str, object]:
        raise RuntimeError("generation failed: unrecoverable")

    monkeypatch.setattr(hecate_dev.bench.herd, "run_herd_bench", broken)
    with pytest.raises(RuntimeError):
        main(["bench", "herd", "--results", str(tmp_path)])
    saved = json.loads((tmp_path / "herd.json").read_text())
    assert saved["report"] == {"failed": "RuntimeError: generation failed: unrecoverable"}
    doc = render({**results(), "herd": saved})
    herd = _section(doc, "A thundering herd")
    assert "The run failed before it produced figures" in herd
    assert "generation failed: unrecoverable" in herd
    assert "| the herd suite ran to the end | failed | **not met** |" in _section(doc, "Headline")
    assert "bench-herd.png" not in doc


README = """# Project

Some prose that must survive, with a table of its own:

| a | b |
|---|---|
| 1 | 2 |

## Figures

Intro that stays.

<!-- bench:figures:start -->
An old table, with old figures.
<!-- bench:figures:end -->

Prose after the table stays too.
"""


def test_the_readme_figures_are_the_headline_with_its_runs() -> None:
    block = figures(results(), doc="docs/BENCHMARKS.md")
    lead = " ".join(block.split("\n\n")[0].split())
    assert lead == (
        "From the latest `make bench` run (x86_64 Test CPU, 2 cores, 2026-01-02, commit "
        "`abc1234`); [the report](docs/BENCHMARKS.md) has the command of every figure and "
        "how it was measured:"
    )
    headline = _section(render(results()), "Headline")
    for row in block.splitlines():
        if row.startswith("| ") and "target" not in row:
            assert row in headline  # the same rows, figures and verdicts as the report
    assert (
        "| herd (simulated): `hecate-queue` ≤ 1.05 attempts per success | 1.00 attempts | met |"
        in block
    )
    assert figures(results(), doc="docs/BENCHMARKS.md") == block  # pure


def test_the_readme_figures_say_which_suites_did_not_run() -> None:
    block = figures(results(llm=False))
    assert "| SmolLM2-135M: one process and across the swarm | not run (`hecate bench llm`)" in (
        block
    )
    assert "No saved benchmark results" in figures({})


def test_splicing_replaces_only_what_lies_between_the_markers() -> None:
    out = splice(README, "| new | table |\n")
    assert out.split(FIGURES_START)[0] == README.split(FIGURES_START)[0]
    assert out.split(FIGURES_END)[1] == README.split(FIGURES_END)[1]
    assert f"{FIGURES_START}\n| new | table |\n{FIGURES_END}" in out
    assert splice(out, "| new | table |\n") == out  # idempotent


@pytest.mark.parametrize(
    "broken",
    [
        README.replace(FIGURES_START, ""),
        README.replace(FIGURES_END, ""),
        README + FIGURES_START + "\n",
        README.replace(FIGURES_START, "@@")
        .replace(FIGURES_END, FIGURES_START)
        .replace("@@", FIGURES_END),
    ],
)
def test_a_readme_without_sound_markers_is_refused(broken: str) -> None:
    with pytest.raises(MarkersError):
        splice(broken, "x")


def test_the_report_command_rewrites_the_readme_only_between_its_markers(
    tmp_path: Path,
) -> None:
    saved = tmp_path / "results"
    saved.mkdir()
    for suite, doc in results().items():
        (saved / f"{suite}.json").write_text(json.dumps(doc))
    readme = tmp_path / "README.md"
    readme.write_text(README)
    out, img = tmp_path / "docs" / "BENCHMARKS.md", tmp_path / "docs" / "img"
    argv = ["bench", "report", "--results", str(saved), "--doc", str(out), "--img", str(img)]
    assert main([*argv, "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.split(FIGURES_START)[0] == README.split(FIGURES_START)[0]
    assert text.split(FIGURES_END)[1] == README.split(FIGURES_END)[1]
    between = text.split(FIGURES_START)[1].split(FIGURES_END)[0]
    assert "An old table" not in between
    assert between.strip() == figures(results(), doc="docs/BENCHMARKS.md").strip()
    # Broken markers: the command fails with one line and writes nothing at all.
    readme.write_text(README.replace(FIGURES_END, ""))
    out.unlink()
    assert main([*argv, "--readme", str(readme)]) == 2
    assert readme.read_text() == README.replace(FIGURES_END, "")
    assert not out.exists()


def test_a_chaos_scenario_run_again_because_its_fault_missed_says_so() -> None:
    saved = results()
    saved["chaos"]["report"]["scenarios"][0]["missed"] = 1
    chaos = _section(render(saved), "Chaos")
    assert "(run 2 times: the fault hit no live traffic before)" in chaos
    assert chaos.count("the fault hit no live traffic before") == 1  # only node-kill's row


def test_the_token_time_section_splits_a_step_and_fails_on_a_wrong_text() -> None:
    doc = results()
    tokens = _section(render(doc), "Where a token's time goes")
    assert (
        "| compute: the step's batch in the engine, 3 stages | 12.00 (69 %) | 36.00 (69 %) |"
        in tokens
    )
    assert "| **sum: a user's decode step** | **17.30** | **52.00** |" in tokens
    assert "Every generation's text equals the single-process greedy text: yes." in tokens
    doc["tokens"]["report"]["levels"]["16"]["wrong_texts"] = 2
    wrong = render(doc)
    assert "**no, 2 differ**" in _section(wrong, "Where a token's time goes")
    assert (
        "| every timed generation gives the single-process text (token time) | 2 differ "
        "| **not met** |" in _section(wrong, "Headline")
    )


def test_the_scale_section_tables_each_size_and_says_what_many_routers_cost() -> None:
    scale = _section(render(results()), "A swarm of many nodes")
    assert "| 100 | 1 | 100 |" in scale
    assert scale.count("| 2,000 | 2 | 2,000 | 7.1 |") == 1  # the many-routers run is prose
    assert (
        "10 routers following 2,000 nodes: each received 508,000 bytes a second of "
        "telemetry and spent 0.020 of a core (one router alone: 0.020); the nats-server "
        "spent 0.400 of a core (0.100 with one router)."
    ) in scale.replace("**", "")
    assert "What broke" not in scale


def test_the_scale_section_sets_shared_intake_beside_one_replica() -> None:
    scale = _section(render(results()), "A swarm of many nodes")
    assert "The heartbeat intake shared by several telemetry replicas" in scale
    # The sharded run has a table of its own, with the one-replica figures beside.
    assert (
        "| 2,000 | 2 | 2,000 | 7.0 | 2,000 | 990 + 1,010; 0 missed | 0.011 + 0.012 | 11.5 (40.0) |"
    ) in scale
    assert "| 2,000 / 2,000; 0 |" in scale  # the one-replica table: heard, sent, missed


def test_the_scale_section_judges_the_cut_off_from_its_figures() -> None:
    scale = _section(render(results()), "A swarm of many nodes").replace("\n", " ")
    assert "Every request answered right: met (900 answered, 0 failed, 0 wrong)" in scale
    assert "called down within 2 s at p99: met (p50 1.40 s, p99 1.90 s" in scale
    assert "the plan repaired in one plan: met (plans published from the cut" in scale
    assert "not measured yet" not in scale


def test_the_stage_ring_is_judged_per_configuration_on_its_paired_rounds() -> None:
    """Every round of one configuration at or above 0.9 is met; every round below is
    not met; the rounds and the text's check come from the saved result."""
    doc = render(results())
    ring = _section(doc, "Three stages with no bus")
    assert (
        "| 3 stages, 1 thread each, never spinning (as `hecate up` runs nodes) "
        "| 56.0, 64.0, 58.5 | 0.700, 0.640, 0.650 | 330.0, 340.0, 420.0 |"
    ) in ring
    assert "all equal to the single process's greedy tokens" in ring
    headline = _section(doc, "Headline")
    assert (
        "3 stages with no bus (1 thread) ≥ 0.9× one process, 1 user "
        "| 0.650× (median of 3; 0.640–0.700 holds it at 75%) | **not met**"
    ) in headline
    assert (
        "3 stages with no bus (2 threads, spin in runs) ≥ 0.9× one process, 1 user "
        "| 0.900× (median of 3; 0.900–0.910 holds it at 75%) | met"
    ) in headline


def test_the_schema_s_cost_is_judged_on_its_paired_rounds_and_its_answers_checked() -> None:
    doc = render(results())
    section = _section(doc, "Answers held to a JSON Schema")
    assert "| llguidance (the nodes') | 0.020 | a bit per token |" in section
    assert "| held ÷ free | 0.950, 0.987, 0.854 |" in section
    assert (
        "parsed and validated against it, and every free answer was the same greedy text: yes"
        in (section)
    )
    headline = _section(doc, "Headline")
    assert (
        "an answer held to a schema ≥ 0.9× free tokens/s | 0.950× (median of 3; 0.854–0.987 holds "
        "it at 75%) | undecided"
    ) in headline


def test_the_memory_section_judges_each_model_and_each_pooled_run() -> None:
    doc = render(results())
    memory = _section(doc, "Memory at real sizes")
    assert "| llama-1b | [0, 16) | 726 | 1160 (1.60×) | 1572 (2.17×) | 1035 | 1.5 |" in memory
    assert "| llama-1b, HECATE | 3 × 1536 | 0–10: 852; 10–16: 898; none: 53 |" in memory
    assert "1: 7.50 (7.50, 7.40, 7.90)" in memory
    assert "“layers 0-16 need 1.87 GiB; this node has 1.44 GiB (cgroup) for them”" in memory
    headline = _section(doc, "Headline")
    assert "memory, llama-1b: every range" in headline
    assert "0.99× (rounds 0.96, 1.04, 0.99) at 1" in headline
    assert "| llama-1b | decode, tg128 | 17.0, 17.5, 16.8 | 40.0, 41.0, 39.0 |" in memory
    assert "decode, tg128 at llama-1b ≥ 1.0× llama-bench, same threads | 0.427×" in headline
