"""``hecate swarm-sim`` as a user runs it: JSON on stdout, one-line errors, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hecate.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def sim(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    code = main(["swarm-sim", *args])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else {}), err


def route_nodes(step: dict[str, Any]) -> list[str]:
    return [s["node_id"] for s in step["route"]["stages"]]


def test_the_readme_example_fails_over_to_the_replica_and_grows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, doc, _ = sim(
        capsys, "--topology", str(EXAMPLES / "swarm.json"), "--kill", "gpu", "--pipelines", "2"
    )
    assert code == 0
    assert [p["pipeline_id"] for p in doc["plan"]["pipelines"]] == ["ncm-base-r0", "ncm-base-r1"]
    start, failover, *growth = doc["steps"]
    assert start == {"step": "start", "status": "healthy", "route": start["route"]}
    assert set(start["route"]) == {"model_id", "pipeline_id", "cost", "stages"}
    assert route_nodes(start) == ["gpu"]
    assert failover["killed"] == "gpu"
    assert (failover["kind"], failover["degraded"], failover["replaced"]) == ("replica", False, [])
    assert "gpu" not in route_nodes(failover)
    assert failover["status"] == "degraded"
    assert [g["added"] for g in growth] == ["newcomer", "workstation"]
    assert [g["kind"] for g in growth] == ["replica", "expert"]
    assert all(g["step"] == "growth" for g in growth)
    assert doc["final_plan_valid"] is True


def test_kills_are_applied_in_order_and_can_end_in_a_splice(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, doc, _ = sim(
        capsys,
        "--topology",
        str(EXAMPLES / "splice.json"),
        "--kill",
        "rack1-b",
        "--kill",
        "rack2-a",
    )
    assert code == 0
    first, second = doc["steps"][1:]
    assert (first["killed"], first["kind"]) == ("rack1-b", "replica")
    assert (second["killed"], second["kind"]) == ("rack2-a", "splice")
    assert second["replaced"] == [
        {"layer_start": 0, "layer_end": 6, "old_node": "rack2-a", "new_node": "rack1-a"}
    ]
    assert route_nodes(second) == ["rack1-a", "rack2-b"]


def test_a_degraded_answer_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, _ = sim(
        capsys, "--topology", str(EXAMPLES / "degraded.json"), "--kill", "gpu", "--pipelines", "1"
    )
    assert code == 0
    step = doc["steps"][1]
    assert (step["kind"], step["degraded"], step["route"]["model_id"]) == (
        "degraded",
        True,
        "ncm-mini",
    )


def test_an_unrecoverable_loss_is_an_explicit_step_and_the_swarm_keeps_its_survivors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, doc, _ = sim(
        capsys,
        "--topology",
        str(EXAMPLES / "unrecoverable.json"),
        "--kill",
        "laptop",
        "--pipelines",
        "1",
    )
    assert code == 0
    lost, grown = doc["steps"][1:]
    assert (lost["kind"], lost["route"], lost["status"]) == ("unrecoverable", None, "degraded")
    assert lost["error"]["code"] == "unrecoverable"
    assert (grown["kind"], grown["status"], route_nodes(grown)) == (
        "replica",
        "healthy",
        ["workstation"],
    )


def test_both_planners_are_selectable(capsys: pytest.CaptureFixture[str]) -> None:
    plans = {}
    for planner in ("greedy", "proportional"):
        code, doc, _ = sim(capsys, "--topology", str(EXAMPLES / "swarm.json"), "--planner", planner)
        assert code == 0
        assert doc["final_plan_valid"]
        plans[planner] = doc["plan"]
    assert plans["greedy"] != plans["proportional"]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "topology.json"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kill", "nobody"], "unknown node 'nobody'"),
        (["--pipelines", "5"], "holds 2 of the 5 requested pipelines"),
    ],
)
def test_user_errors_are_one_line_on_stderr_with_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _, err = sim(capsys, "--topology", str(EXAMPLES / "swarm.json"), *args)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "invalid topology"),
        ('{"models": [], "nodes": []}', "invalid topology"),
        ('{"models": [{"id": "m", "layers": 4}], "nodes": [{"id": "a"}]}', "capacity_layers"),
        ('{"models": [{"id": "M!", "layers": 4}], "nodes": []}', "invalid topology"),
        (
            '{"models": [{"id": "m", "layers": 4}], "nodes": [{"id": "a", "capacity_layers": 4}],'
            ' "extra": 1}',
            "extra",
        ),
        (
            '{"models": [{"id": "m", "layers": 4, "role": "expert"}],'
            ' "nodes": [{"id": "a", "capacity_layers": 4}]}',
            "exactly one model with role 'base'",
        ),
        (
            '{"models": [{"id": "m", "layers": 4}], "nodes": [{"id": "a", "capacity_layers": 1}]}',
            "cannot hold one pipeline",
        ),
    ],
)
def test_malformed_topologies_are_refused_clearly(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str
) -> None:
    code, _, err = sim(capsys, "--topology", write(tmp_path, text), "--pipelines", "1")
    assert code == 2
    assert message in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_a_missing_file_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = sim(capsys, "--topology", "/nonexistent/topology.json")
    assert code == 2
    assert "No such file" in err
    assert "/nonexistent/topology.json" in err


def test_the_installed_console_script_runs_the_readme_command() -> None:
    script = Path(sys.executable).with_name("hecate")
    done = subprocess.run(
        [
            str(script),
            "swarm-sim",
            "--topology",
            str(EXAMPLES / "swarm.json"),
            "--kill",
            "gpu",
            "--pipelines",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["steps"][1]["kind"] == "replica"
    bad = subprocess.run(
        [str(script), "swarm-sim", "--topology", str(EXAMPLES / "swarm.json"), "--kill", "ghost"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("hecate: error:")
    assert "Traceback" not in bad.stderr
