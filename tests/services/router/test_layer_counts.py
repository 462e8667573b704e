"""What a layer network's answer cost, from the model to the router's reply: the stage
that embeds the prompt counts it, the one that decodes counts its text, a chain
carries the prompt's count to its end, and the router reports both."""

from __future__ import annotations

import msgspec
import pytest

from hecate.core import Stage
from hecate.model.executor import LayerInput
from hecate.model.null import NullModel
from hecate.model.toy import ToyModel
from hecate.wire.stages import ActivationReply, LayersStage, OutputReply, StageReply
from hecate_node.chain import next_stage
from hecate_router.flow import Answer, Send, StageReplied, Start
from tests.services.router.test_lifecycle import Run, Swarm, machine

TOY = ToyModel()


def _stage(
    start: int,
    end: int,
    *,
    prompt: str = "",
    activation: bytes = b"",
    decode_tokens: int | None = None,
) -> LayerInput:
    return LayerInput(
        model_id="m",
        layer_start=start,
        layer_end=end,
        model_layers=12,
        prompt=prompt,
        activation=activation,
        decode_tokens=decode_tokens,
    )


@pytest.mark.parametrize(("prompt", "words"), [("", 0), ("hi", 1), (" a  b\nc\t", 3)])
def test_the_toy_counts_words(prompt: str, words: int) -> None:
    assert TOY.count("m", prompt) == words


def test_the_stage_that_embeds_counts_the_prompt_and_the_one_that_decodes_its_text() -> None:
    first = TOY.execute(_stage(0, 4, prompt="three little words"))
    assert (first.prompt_count, first.completion_count, first.output) == (3, None, None)
    middle = TOY.execute(_stage(4, 8, activation=first.activation))
    assert (middle.prompt_count, middle.completion_count) == (None, None)
    last = TOY.execute(_stage(8, 12, activation=middle.activation, decode_tokens=5))
    assert last.output is not None
    assert (last.prompt_count, last.completion_count) == (None, 5)
    assert len(last.output.split()) == 5
    whole = TOY.execute(_stage(0, 12, prompt="three little words", decode_tokens=0))
    assert (whole.output, whole.prompt_count, whole.completion_count) == ("", 3, 0)


def test_a_network_that_does_not_count_says_nothing() -> None:
    out = NullModel().execute(_stage(0, 12, prompt="a b", decode_tokens=2))
    assert (out.prompt_count, out.completion_count) == (None, None)


def test_a_chain_carries_the_prompts_count_to_its_end() -> None:
    req = LayersStage(
        request_id="r",
        model_id="m",
        layer_start=0,
        layer_end=4,
        model_layers=12,
        chain=(Stage(node_id="b", layer_start=4, layer_end=12),),
        prompt="three little words",
    )
    nxt = next_stage(req, ActivationReply(activation=b"x", prompt_count=3))
    assert isinstance(nxt, LayersStage)
    assert (nxt.prompt, nxt.prompt_count, nxt.activation) == ("", 3, b"x")
    wire = msgspec.msgpack.encode(nxt)
    assert msgspec.msgpack.decode(wire, type=LayersStage).prompt_count == 3


def _answered(chain: bool, replies: list[StageReply]) -> Answer:
    run = Run(machine(Swarm(), chain=chain))
    run.feed(Start(0.0))
    for reply in replies:
        s = run.last
        assert isinstance(s, Send)
        run.feed(StageReplied(s.send, s.stage + s.chained, reply, 0.01))
    [answer] = run.answers()
    return answer


def test_the_router_reports_the_counts_of_a_route_it_walks() -> None:
    answer = _answered(
        chain=False,
        replies=[
            ActivationReply(activation=b"\x04", prompt_count=2),  # the first stage counts
            ActivationReply(activation=b"\x08"),
            OutputReply(output="x y z", completion_count=3),
        ],
    )
    assert answer.reply.ok
    assert (answer.reply.prompt_tokens, answer.reply.completion_tokens) == (2, 3)


def test_the_router_reports_the_counts_a_chains_end_brings_back() -> None:
    answer = _answered(
        chain=True, replies=[OutputReply(output="x y", prompt_count=2, completion_count=2)]
    )
    assert (answer.reply.prompt_tokens, answer.reply.completion_tokens) == (2, 2)


def test_a_model_that_does_not_count_reports_no_counts() -> None:
    answer = _answered(chain=True, replies=[OutputReply(output="x y")])
    assert (answer.reply.prompt_tokens, answer.reply.completion_tokens) == (None, None)
