"""Every number and every tools array the wire carries is bounded where it is decoded:
a seed past int64 or tools that are no array of functions are refused as the message
decodes (a typed bad_request at the bus layer), so that nothing a router builds from a
decoded request fails to encode again, and no node meets such tools."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate.core import Route, Stage
from hecate.wire.messages import InferRequest
from hecate.wire.stages import request_decoder
from hecate.wire.tools import MAX_TOOL_DEPTH, depth, tools_problem
from hecate_router.generation import Generation
from hecate_router.stages import Dispatch, stage_request

_infer = msgspec.json.Decoder(InferRequest)
_enc = msgspec.msgpack.Encoder()
ROUTE = Route(
    pipeline_id="p",
    model_id="m",
    cost=1.0,
    stages=(Stage(node_id="a", layer_start=0, layer_end=4),),
)
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def infer(**fields: Any) -> InferRequest:
    return _infer.decode(json.dumps({"prompt": "hi", **fields}))


@pytest.mark.parametrize("seed", [2**63, 2**64, -(2**63) - 1, 10**40])
def test_a_seed_past_int64_is_refused_as_it_decodes(seed: int) -> None:
    with pytest.raises(msgspec.ValidationError, match=r"\$\.seed"):
        infer(seed=seed)


@given(
    seed=st.integers(-(2**63), 2**63 - 1),
    temperature=st.floats(0, 10),
    top_p=st.floats(0, 1, exclude_min=True),
)
def test_whatever_decodes_the_router_can_send_on(
    seed: int, temperature: float, top_p: float
) -> None:
    request = infer(seed=seed, temperature=temperature, top_p=top_p)
    sent = stage_request(
        "steps", Dispatch(ROUTE, 0, 0, 4, 1), request, "r", b"", "r.1", Generation()
    )
    assert request_decoder().decode(_enc.encode(sent)) == sent


@pytest.mark.parametrize(
    "tools",
    ["1", "null", '{"a": 1}', '"x"', "[1]", '[{"type": "function"}]', "[" * 3000 + "]" * 3000],
)
def test_tools_that_are_no_array_of_functions_are_refused_as_they_decode(tools: str) -> None:
    # At the router's intake; the first stage's template refuses them again
    # (tests/shared/engine/test_template_hostile.py).
    with pytest.raises(msgspec.ValidationError, match="tools"):
        infer(tools=tools)


def test_a_real_tools_array_decodes() -> None:
    assert infer(tools=json.dumps([TOOL, TOOL])).tools


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=10,
)


@given(value=json_values)
def test_any_json_value_is_a_tools_array_or_a_named_refusal(value: object) -> None:
    problem = tools_problem(json.dumps(value))
    if value == []:
        assert problem is None
    else:
        assert problem is not None
        assert problem.startswith("tools:")


@given(levels=st.integers(1, 200), text=st.text(alphabet='[]{}"\\x', max_size=30))
def test_depth_counts_brackets_outside_strings(levels: int, text: str) -> None:
    nested = "[" * levels + json.dumps(text) + "]" * levels
    assert depth(nested) == levels
    assert tools_problem(nested) is not None
    assert levels <= MAX_TOOL_DEPTH or "deep" in str(tools_problem(nested))
