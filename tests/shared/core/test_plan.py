"""SwarmPlan.validate(): every problem an operator must hear about, none invented."""

from __future__ import annotations

from hecate.core import ModelSpec, NodeProfile, SwarmPlan
from tests.support.builders import pipeline, plan


def codes(p: SwarmPlan) -> list[str]:
    return [problem.code for problem in p.validate()]


def test_a_plan_that_tiles_every_layer_is_valid() -> None:
    p = plan([pipeline("m-r0", "m", ("a", 0, 4), ("b", 4, 8))])
    assert p.validate() == []


def test_a_gap_between_stages_is_reported_with_the_missing_layers() -> None:
    p = plan(
        [pipeline("m-r0", "m", ("a", 0, 3), ("b", 4, 8))],
        models=[ModelSpec(model_id="m", layers=8)],
    )
    [problem] = p.validate()
    assert problem.code == "gap"
    assert "[3, 4)" in problem.message


def test_missing_tail_layers_are_a_gap() -> None:
    p = plan([pipeline("m-r0", "m", ("a", 0, 6))], models=[ModelSpec(model_id="m", layers=8)])
    assert codes(p) == ["gap"]


def test_overlapping_stages_are_reported() -> None:
    p = plan(
        [pipeline("m-r0", "m", ("a", 0, 5), ("b", 4, 8))],
        models=[ModelSpec(model_id="m", layers=8)],
    )
    assert codes(p) == ["overlap"]


def test_a_pipeline_running_past_the_last_layer_is_reported() -> None:
    p = plan([pipeline("m-r0", "m", ("a", 0, 9))], models=[ModelSpec(model_id="m", layers=8)])
    assert codes(p) == ["out_of_range"]


def test_a_stage_on_a_node_that_is_not_a_member_is_reported() -> None:
    good = plan([pipeline("m-r0", "m", ("a", 0, 8))])
    bad = SwarmPlan(
        epoch=1,
        models=good.models,
        nodes=good.nodes,
        pipelines=(pipeline("m-r0", "m", ("ghost", 0, 8)),),
    )
    assert codes(bad) == ["unknown_node"]


def test_a_node_given_more_layers_than_its_capacity_is_reported() -> None:
    p = plan([pipeline("m-r0", "m", ("a", 0, 8)), pipeline("m-r1", "m", ("a", 0, 8))], capacity=12)
    [problem] = p.validate()
    assert problem.code == "capacity_exceeded"
    assert "16 layers" in problem.message
    assert "12" in problem.message


def test_unknown_model_duplicate_ids_and_empty_pipelines_are_reported() -> None:
    p = SwarmPlan(
        epoch=3,
        models=(ModelSpec(model_id="m", layers=4), ModelSpec(model_id="m", layers=4)),
        nodes=(NodeProfile(node_id="a", capacity_layers=8),),
        pipelines=(
            pipeline("x-r0", "other", ("a", 0, 4)),
            pipeline("m-r0", "m"),
            pipeline("m-r0", "m", ("a", 0, 4)),
        ),
    )
    assert sorted(codes(p)) == [
        "duplicate_model",
        "duplicate_pipeline",
        "empty_pipeline",
        "unknown_model",
    ]


def test_problems_read_as_code_and_message() -> None:
    p = plan([pipeline("m-r0", "m", ("a", 0, 6))], models=[ModelSpec(model_id="m", layers=8)])
    assert str(p.validate()[0]).startswith("gap: pipeline m-r0")
