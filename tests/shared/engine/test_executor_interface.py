"""The executor interface: every executor declares one of three kinds and implements
that kind's protocol, the registry checks it (built-ins and entry points alike), and a
layer network's one call gives what its three steps give."""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
from collections.abc import Sequence
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

import hecate.executors as registry
from hecate.core import NodeProfile
from hecate.executors import EXECUTORS, checked, get_executor, kind_of
from hecate.model import ExecutorError, LayerInput, StepInput, StepOutput
from hecate.model.toy import ToyModel, reference
from hecate_node.batching import MAX_BATCH
from hecate_node.config import NodeConfig
from hecate_node.service import Node
from hecate_node.upstream import UpstreamModel

KINDS = {
    "toy": "layers",
    "null": "layers",
    "smollm2": "steps",
    "smollm2-numpy": "steps",
    "gemma3-270m": "steps",
}


def test_every_built_in_declares_the_kind_it_implements() -> None:
    assert set(EXECUTORS) == set(KINDS)
    for name, kind in KINDS.items():
        executor = get_executor(name)  # the real model's weights load only when a range is used
        assert executor.name == name
        assert kind_of(executor) == kind
    assert kind_of(UpstreamModel("http://127.0.0.1:9", "m")) == "whole"


class HalfDone:
    """Says it runs layers, but never learnt how."""

    name = "half"
    kind = "layers"

    def warm_up(self, model_id: str, layer_start: int, layer_end: int) -> None:
        del model_id, layer_start, layer_end


class Steps:
    """A minimal steps executor: echoes each step's activation."""

    name = "echo-steps"
    kind: Literal["steps"] = "steps"
    prefill_chunk = 8

    def execute(self, steps: Sequence[StepInput]) -> list[StepOutput | ExecutorError]:
        return [StepOutput(activation=s.activation, positions=1) for s in steps]

    def rows(self, step: StepInput) -> int | None:
        return len(step.activation) // 4 or 1

    def tokenize(self, step: StepInput) -> None: ...

    def prepare(self, ranges: list[tuple[int, int]]) -> None: ...

    def release(self, session: str) -> None: ...

    def session_count(self) -> int:
        return 0

    def limit_payload(self, max_payload: int) -> None: ...

    def warm_up(self, model_id: str, layer_start: int, layer_end: int) -> None: ...


def test_an_executor_missing_its_kinds_methods_is_refused_by_name() -> None:
    with pytest.raises(ExecutorError) as refused:
        kind_of(HalfDone())
    assert refused.value.code == "unknown_executor"
    assert "'half' declares kind 'layers' but lacks execute" in refused.value.message
    odd = HalfDone()
    odd.kind = "sideways"
    with pytest.raises(ExecutorError, match="an executor's kind is one of layers, steps, whole"):
        kind_of(odd)


def test_an_object_under_another_name_is_refused() -> None:
    with pytest.raises(ExecutorError, match="'toy' was asked for but the object given is 'null'"):
        checked(get_executor("null"), "toy")


def test_an_entry_point_adds_an_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    point = importlib.metadata.EntryPoint("echo-steps", f"{__name__}:Steps", registry.GROUP)
    found = importlib.metadata.EntryPoints([point])
    monkeypatch.setattr(
        registry, "entry_points", lambda group: found if group == registry.GROUP else ()
    )
    assert registry.available()["echo-steps"] == f"{__name__}:Steps"
    assert kind_of(get_executor("echo-steps")) == "steps"
    known = "echo-steps, gemma3-270m, null, smollm2, smollm2-numpy, toy"
    with pytest.raises(ExecutorError, match=f"known executors: {known}"):
        get_executor("gpt-17")


@given(
    prompt=st.text(max_size=40),
    cut=st.integers(1, 7),
    tokens=st.integers(0, 6),
)
def test_a_split_run_through_execute_gives_the_reference(
    prompt: str, cut: int, tokens: int
) -> None:
    toy = ToyModel()
    first = toy.execute(
        LayerInput(model_id="m", layer_start=0, layer_end=cut, model_layers=8, prompt=prompt)
    )
    assert first.output is None
    last = toy.execute(
        LayerInput(
            model_id="m",
            layer_start=cut,
            layer_end=8,
            model_layers=8,
            activation=first.activation,
            decode_tokens=tokens,
        )
    )
    assert last.activation == b""
    assert last.output == reference("m", 8, prompt, tokens)


PROFILE = NodeProfile(node_id="n1", capacity_layers=4)


def test_the_node_config_keeps_the_defaults_and_names_a_bad_field() -> None:
    config = NodeConfig(profile=PROFILE)
    assert (config.executor, config.heartbeat_s, config.remeasure_s) == ("toy", 0.1, 5.0)
    assert not config.accept_faults
    assert NodeConfig(profile=PROFILE, executor="null").joined().executor == "null"
    for field, value in (
        ("heartbeat_s", 0.0),
        ("remeasure_s", -1.0),
        ("heartbeat_s", float("nan")),
    ):
        bad: dict[str, Any] = {field: value}
        with pytest.raises(ValueError, match=f"^{field}: must be a positive number of seconds"):
            NodeConfig(profile=PROFILE, **bad)
    with pytest.raises(
        ValueError, match=r"^heartbeat_budget_per_s: must be a positive number of beats"
    ):
        NodeConfig(profile=PROFILE, heartbeat_budget_per_s=0.0)
    with pytest.raises(ValueError, match=r"^executor: "):
        NodeConfig(profile=PROFILE, executor="")
    with pytest.raises(TypeError):
        NodeConfig(PROFILE)  # type: ignore[call-arg]  # keyword-only


def test_a_node_refuses_an_executor_that_is_not_the_one_configured() -> None:
    log = logging.getLogger("test.node")
    with pytest.raises(ExecutorError, match="'toy' was asked for"):
        Node(NodeConfig(profile=PROFILE), log=log, executor=get_executor("null"))
    with pytest.raises(ExecutorError, match="unknown_executor: no executor named 'gpt-17'"):
        Node(NodeConfig(profile=PROFILE, executor="gpt-17"), log=log)


async def test_each_kind_is_served_as_its_kind_needs() -> None:
    log = logging.getLogger("test.node")
    toy = Node(NodeConfig(profile=PROFILE), log=log)
    assert (toy.runner.kind, toy.runner.per_stage, toy.runner.concurrency) == ("layers", True, 1)
    steps = Node(NodeConfig(profile=PROFILE, executor="echo-steps"), log=log, executor=Steps())
    try:
        runner = steps.runner
        assert (runner.kind, runner.per_stage) == ("steps", False)
        assert runner.concurrency == MAX_BATCH * 4  # steps wait side by side to share a batch
        await asyncio.sleep(0)
    finally:
        steps.runner.close()
    upstream = UpstreamModel("http://127.0.0.1:9", "m")
    whole = Node(NodeConfig(profile=PROFILE, executor="upstream"), log=log, executor=upstream)
    assert (whole.runner.kind, whole.runner.warms_up) == ("whole", False)
    await upstream.close()


def test_the_engine_s_threads_come_from_the_environment_or_are_refused_by_name() -> None:
    from hecate.core.errors import HecateError
    from hecate.llm.executor import engine_threads

    assert engine_threads({}) is None  # every core
    assert engine_threads({"HECATE_ENGINE_THREADS": "1"}) == 1
    for bad in ("0", "-2", "two", "1.5"):
        with pytest.raises(HecateError, match="HECATE_ENGINE_THREADS"):
            engine_threads({"HECATE_ENGINE_THREADS": bad})


def test_a_local_swarm_s_compute_processes_get_one_engine_thread_unless_told() -> None:
    from hecate_launcher import node_env

    assert node_env({})["HECATE_ENGINE_THREADS"] == "1"
    assert node_env({"HECATE_ENGINE_THREADS": "4"})["HECATE_ENGINE_THREADS"] == "4"
    assert node_env({}, threads=2)["HECATE_ENGINE_THREADS"] == "2"
