"""Stage messages are tagged unions: each variant round-trips as itself, a message of no
known kind is refused, and a dispatch sends the variant its model's executor takes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate.core import Route, Stage
from hecate.core.plan import ModelSpec, NodeProfile, SwarmPlan
from hecate.wire.messages import ErrorBody, ErrorReply, InferRequest
from hecate.wire.stages import (
    ActivationReply,
    LayersStage,
    OutputReply,
    StageReply,
    StageRequest,
    StepStage,
    TokenReply,
    WholeStage,
    reply_decoder,
    request_decoder,
)
from hecate_node.chain import next_stage
from hecate_node.upstream import UpstreamModel
from hecate_router.generation import Generation
from hecate_router.stages import Dispatch, stage_request

_enc = msgspec.msgpack.Encoder()
HEADER: dict[str, Any] = {
    "request_id": "r1",
    "model_id": "m",
    "layer_start": 0,
    "layer_end": 4,
    "model_layers": 8,
}

REQUESTS: list[StageRequest] = [
    LayersStage(**HEADER, prompt="hi", decode_tokens=3),
    LayersStage(
        **HEADER, activation=b"\x00" * 16, chain=(Stage(node_id="b", layer_start=4, layer_end=8),)
    ),
    StepStage(**HEADER, session="r1.1", position=3, tokens=[1, 2], temperature=0.5, seed=7),
    WholeStage(**HEADER, prompt="hi", decode_tokens=16),
]
REPLIES: list[StageReply] = [
    ActivationReply(activation=b"\x01" * 8, prompt_tokens=[1, 2], positions=2),
    TokenReply(token=42, text=" the", eos=False, positions=1, compute_ms=1.5),
    OutputReply(output="done"),
]


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: type(r).__name__)
def test_every_request_variant_round_trips_as_itself(request_: StageRequest) -> None:
    assert request_decoder().decode(_enc.encode(request_)) == request_


@pytest.mark.parametrize("reply", REPLIES, ids=lambda r: type(r).__name__)
def test_every_reply_variant_round_trips_as_itself(reply: StageReply) -> None:
    decoded = reply_decoder().decode(_enc.encode(reply))
    assert decoded == reply
    assert decoded.ok


def test_a_message_of_no_known_kind_is_refused() -> None:
    for body in ({**HEADER}, {**HEADER, "kind": "teleport"}):
        with pytest.raises(msgspec.ValidationError):
            request_decoder().decode(_enc.encode(body))


def test_an_error_reply_keeps_its_shape_and_is_no_stage_answer() -> None:
    error = ErrorReply(error=ErrorBody(code="not_hosted", message="no"))
    body = _enc.encode(error)
    assert msgspec.msgpack.decode(body) == {
        "ok": False,
        "error": {"code": "not_hosted", "message": "no"},
    }
    with pytest.raises(msgspec.ValidationError):
        reply_decoder().decode(body)


def test_a_router_knows_a_model_s_kind_from_the_plan_its_nodes_joined() -> None:
    """The kind comes from the executor, through the node's profile into the plan: the
    router needs no list of executor names (a plugin's included) to dispatch a stage."""
    plan = SwarmPlan(
        epoch=1,
        models=(
            ModelSpec(model_id="m", layers=2, executor="plugin"),
            ModelSpec(model_id="u", layers=1, executor="upstream"),
            ModelSpec(model_id="idle", layers=1, executor="nobody-runs-it"),
        ),
        nodes=(
            NodeProfile(node_id="a", capacity_layers=2, executor="plugin", kind="steps"),
            NodeProfile(
                node_id="b", capacity_layers=1, executor="upstream", kind=UpstreamModel.kind
            ),
        ),
        pipelines=(),
    )
    assert plan.executor_kind("m") == "steps"
    assert plan.executor_kind("u") == "whole"
    assert plan.executor_kind("idle") is None
    assert plan.executor_kind("no-such-model") is None


ROUTE = Route(
    model_id="m",
    pipeline_id="p",
    cost=1.0,
    stages=(
        Stage(node_id="a", layer_start=0, layer_end=4),
        Stage(node_id="b", layer_start=4, layer_end=8),
    ),
)


@given(
    index=st.integers(0, 1),
    chained=st.booleans(),
    kind=st.sampled_from(["layers", "steps", "whole"]),
    tokens=st.none() | st.lists(st.integers(0, 100), max_size=4),
)
def test_a_stage_carries_what_its_kind_takes_and_the_prompt_only_first(
    index: int, chained: bool, kind: str, tokens: list[int] | None
) -> None:
    request = InferRequest(prompt="hi", max_tokens=5, temperature=0.3)
    gen = Generation(step_tokens=tokens, position=2)
    d = Dispatch(ROUTE, index, 1 - index if chained else 0, 8, 3)
    sent = stage_request(kind, d, request, "r1", b"act", "r1.1", gen)  # type: ignore[arg-type]
    assert type(sent) is {"layers": LayersStage, "steps": StepStage, "whole": WholeStage}[kind]
    stage = ROUTE.stages[index]
    assert (sent.layer_start, sent.layer_end, sent.model_layers, sent.epoch, sent.stage_index) == (
        stage.layer_start,
        stage.layer_end,
        8,
        3,
        index,
    )
    assert sent.chain == ROUTE.stages[index + 1 :][: d.chained]
    # The route's end decodes; in a chain every stage carries it down.
    assert sent.decode_tokens == (5 if index == 1 or d.chained else None)
    if isinstance(sent, LayersStage):
        assert sent.prompt == ("hi" if index == 0 else "")
        assert sent.activation == b"act"
    elif isinstance(sent, StepStage):
        assert sent.prompt == ("hi" if index == 0 else "")
        assert sent.tokens == (tokens if index == 0 else None)
        assert (sent.session, sent.position, sent.temperature) == ("r1.1", 2, 0.3)
    else:
        assert sent.prompt == "hi"


def test_a_replay_says_where_its_sampled_tokens_begin_down_the_whole_chain() -> None:
    gen = Generation(prompt_tokens=[5, 6, 7], generated=[8, 9])
    request = InferRequest(prompt="hi", max_tokens=5)
    d = Dispatch(ROUTE, 0, 1, 8, 3)
    assert stage_request("steps", d, request, "r1", b"", "s", gen).sampled_from is None  # type: ignore[union-attr]
    gen.replay()
    sent = stage_request("steps", d, request, "r1", b"", "s", gen)
    assert isinstance(sent, StepStage)
    assert (sent.tokens, sent.position, sent.sampled_from) == ([5, 6, 7, 8, 9], 0, 3)
    onward = next_stage(sent, ActivationReply(activation=b"\0" * 8, positions=2))
    assert isinstance(onward, StepStage)
    assert onward.sampled_from == 3  # a later stage runs the sampled positions as steps too
