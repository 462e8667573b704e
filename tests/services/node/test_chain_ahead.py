"""A chain's first stage running a long sequence's chunks ahead (hecate_node.chain.ahead):
the steps it gives itself tile the sequence, in order, each from where the last ended."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hecate.core import Stage
from hecate.wire.stages import ActivationReply, StepStage
from hecate_node.chain import ahead, next_stage

NEXT = (Stage(node_id="b", layer_start=10, layer_end=20),)


def first_step(**kw: object) -> StepStage:
    fields: dict[str, object] = {
        "request_id": "r1",
        "model_id": "m",
        "layer_start": 0,
        "layer_end": 10,
        "model_layers": 30,
        "session": "f1.1",
        "prompt": "a long prompt",
        "chain": NEXT,
        "run_ahead": True,
    }
    return StepStage(**(fields | kw))  # type: ignore[arg-type]


@given(
    length=st.integers(1, 2000),
    chunk=st.integers(1, 600),
    reused=st.integers(0, 1999),
    replayed=st.booleans(),
)
def test_the_chunks_run_ahead_tile_the_sequence_in_order(
    length: int, chunk: int, reused: int, replayed: bool
) -> None:
    prompt = list(range(1000, 1000 + length))
    reused = min(reused, length - 1)  # a cached prefix leaves the last position to run
    # The prompt as text (tokenized there), or a replay's ids.
    req = first_step(tokens=prompt, prompt="") if replayed else first_step()
    ran: list[int] = []
    while True:
        fed = req.tokens if req.tokens is not None else prompt
        took = reused if req.position == 0 else 0
        rows = min(chunk, len(fed) - took)
        ran.extend(fed[took : took + rows])
        reply = ActivationReply(
            activation=b"", positions=took + rows, prompt_tokens=prompt, reused=took
        )
        after = ahead(req, reply)
        if after is None:
            break
        assert after.position == req.position + took + rows
        assert after.tokens == prompt[after.position :]
        assert (after.prompt, after.messages, after.prompt_tokens) == ("", None, prompt)
        assert (after.session, after.chain) == (req.session, NEXT)
        req = after
    assert reused + len(ran) == length  # every position once, after the cached ones
    assert ran == prompt[reused:]


def test_only_a_chain_s_first_stage_told_so_runs_ahead() -> None:
    reply = ActivationReply(activation=b"", positions=4, prompt_tokens=list(range(10)))
    assert ahead(first_step(), reply) is not None
    assert ahead(first_step(run_ahead=False), reply) is None  # the router sends the rest
    assert ahead(first_step(chain=()), reply) is None  # hop by hop: the router calls each
    whole = ActivationReply(activation=b"", positions=10, prompt_tokens=list(range(10)))
    assert ahead(first_step(), whole) is None  # all of it ran


def test_the_stages_after_the_first_run_what_they_are_sent() -> None:
    reply = ActivationReply(activation=b"\0" * 8, positions=4, prompt_tokens=list(range(10)))
    onward = next_stage(first_step(more=True), reply)
    assert isinstance(onward, StepStage)
    assert onward.more  # the last stage's reply says more follow
    assert not onward.run_ahead
    assert ahead(onward, reply) is None
