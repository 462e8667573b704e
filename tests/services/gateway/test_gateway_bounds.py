"""What the gateway refuses before the swarm hears of it: every number at and past the
edge of OpenAI's documented range, stop strings past their count and length, a body
nested too deep to decode, and tools the grammar library could not hold a call to. Each
a 400 in OpenAI's shape naming the field; never a 500, never a router's error later."""

from __future__ import annotations

import json
import logging
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client
from prometheus_client import CollectorRegistry
from starlette.testclient import TestClient

from hecate.wire.messages import MAX_SCHEMA_CHARS, MAX_STOP_CHARS, MAX_TOKENS, InferRequest
from hecate.wire.tools import MAX_TOOL_DEPTH
from hecate_gateway.app import Gateway, build_app
from hecate_gateway.bridge import Bridge
from hecate_gateway.keys import OpenAccess
from hecate_gateway.metrics import Metrics
from hecate_gateway.openai import MAX_SEED, MAX_STOPS, MIN_SEED, ApiError, parse
from hecate_gateway.swarm import SwarmWatch
from hecate_gateway.tools import MAX_TOOLS

CHAT = {"model": "ncm-base", "messages": [{"role": "user", "content": "hi"}]}


def chat(**fields: Any) -> bytes:
    return json.dumps({**CHAT, **fields}).encode()


def completion(**fields: Any) -> bytes:
    return json.dumps({"model": "ncm-base", "prompt": "once", **fields}).encode()


def body_of(kind: str, fields: dict[str, Any]) -> bytes:
    return chat(**fields) if kind == "chat" else completion(**fields)


def refused(kind: str, body: bytes) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse(kind, body)  # type: ignore[arg-type]
    return caught.value


def assert_openai_400(error: ApiError, param: str | None) -> None:
    assert error.body() == {
        "error": {
            "message": error.message,
            "type": "invalid_request_error",
            "param": param,
            "code": None,
        }
    }
    assert error.status == 400


# -- numbers: each at its limit (accepted) and just past it (refused) ---------------------

ACCEPTED = [
    ("chat", {"seed": MIN_SEED}),
    ("chat", {"seed": MAX_SEED}),
    ("chat", {"seed": -1}),  # OpenAI takes negative seeds; the sampler maps them
    ("completion", {"seed": MAX_SEED}),
    ("chat", {"temperature": 0}),
    ("chat", {"temperature": 2}),
    ("chat", {"top_p": 1}),
    ("chat", {"top_p": 1e-9}),
    ("chat", {"n": 1}),
    ("completion", {"n": 1}),
    ("completion", {"best_of": 1}),
    ("chat", {"max_tokens": 1}),
    ("chat", {"max_tokens": MAX_TOKENS}),
    ("chat", {"max_completion_tokens": 1}),
    ("chat", {"max_completion_tokens": MAX_TOKENS}),
    ("completion", {"max_tokens": MAX_TOKENS}),
    ("chat", {"logprobs": True, "top_logprobs": 0}),
    ("chat", {"logprobs": True, "top_logprobs": 20}),
    ("completion", {"logprobs": 0}),
    ("completion", {"logprobs": 5}),
    ("chat", {"presence_penalty": 0}),
    ("chat", {"frequency_penalty": 0.0}),
    ("chat", {"stop": ["a", "b", "c", "d"]}),
    ("chat", {"stop": ["~" * MAX_STOP_CHARS] * MAX_STOPS}),
    ("completion", {"stop": "~" * MAX_STOP_CHARS}),
]


@pytest.mark.parametrize(("kind", "fields"), ACCEPTED)
def test_each_number_at_its_limit_is_accepted_and_reaches_the_wire_intact(
    kind: str, fields: dict[str, Any]
) -> None:
    request = parse(kind, body_of(kind, fields)).request  # type: ignore[arg-type]
    if "seed" in fields:
        assert request.seed == fields["seed"]
    # What the router decodes: every bound the wire holds the request to, met.
    msgspec.json.decode(msgspec.json.encode(request), type=InferRequest)


REFUSED = [
    # (kind, fields, param, words the message says)
    ("chat", {"seed": MIN_SEED - 1}, "seed", "between"),
    ("chat", {"seed": MAX_SEED + 1}, "seed", "between"),
    ("chat", {"seed": 2**64}, "seed", "between"),
    ("completion", {"seed": 2**64}, "seed", "between"),
    ("chat", {"seed": 1.5}, "seed", "int"),
    ("chat", {"temperature": -0.01}, "temperature", "between 0 and 2"),
    ("chat", {"temperature": 2.01}, "temperature", "between 0 and 2"),
    ("chat", {"top_p": 0}, "top_p", "greater than 0"),
    ("chat", {"top_p": -0.1}, "top_p", "between 0 and 1"),
    ("chat", {"top_p": 1.01}, "top_p", "between 0 and 1"),
    ("chat", {"n": 0}, "n", "between 1 and 128"),
    ("chat", {"n": 129}, "n", "between 1 and 128"),
    ("chat", {"n": 2}, "n", "not supported"),  # in range, but one answer a request
    ("chat", {"n": True}, "n", "an integer"),
    ("completion", {"n": 0}, "n", "between 1 and 128"),
    ("completion", {"best_of": 0}, "best_of", "between 1 and 20"),
    ("completion", {"best_of": 21}, "best_of", "between 1 and 20"),
    ("chat", {"max_tokens": 0}, "max_tokens", f"between 1 and {MAX_TOKENS}"),
    ("chat", {"max_tokens": MAX_TOKENS + 1}, "max_tokens", f"between 1 and {MAX_TOKENS}"),
    ("chat", {"max_tokens": -1}, "max_tokens", "between"),
    ("chat", {"max_completion_tokens": 0}, "max_completion_tokens", "between"),
    ("chat", {"max_completion_tokens": MAX_TOKENS + 1}, "max_completion_tokens", "between"),
    ("completion", {"max_tokens": 0}, "max_tokens", "between"),
    ("completion", {"max_tokens": MAX_TOKENS + 1}, "max_tokens", "between"),
    ("chat", {"logprobs": True, "top_logprobs": -1}, "top_logprobs", "between 0 and 20"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "between 0 and 20"),
    ("completion", {"logprobs": -1}, "logprobs", "between 0 and 5"),
    ("completion", {"logprobs": 6}, "logprobs", "between 0 and 5"),
    ("chat", {"presence_penalty": -2.01}, "presence_penalty", "between -2 and 2"),
    ("chat", {"presence_penalty": 2.01}, "presence_penalty", "between -2 and 2"),
    ("chat", {"presence_penalty": 2}, "presence_penalty", "not supported"),
    ("chat", {"frequency_penalty": -2.01}, "frequency_penalty", "between -2 and 2"),
    ("chat", {"frequency_penalty": 2.01}, "frequency_penalty", "between -2 and 2"),
    ("chat", {"frequency_penalty": -2}, "frequency_penalty", "not supported"),
    ("chat", {"frequency_penalty": "1"}, "frequency_penalty", "a number"),
    ("chat", {"stop": ["a", "b", "c", "d", "e"]}, "stop", f"at most {MAX_STOPS}"),
    ("chat", {"stop": ["~" * (MAX_STOP_CHARS + 1)]}, "stop", f"{MAX_STOP_CHARS} characters"),
    ("chat", {"stop": ["~" * 55_000] * 4}, "stop", f"{MAX_STOP_CHARS} characters"),
    ("completion", {"stop": "~" * (MAX_STOP_CHARS + 1)}, "stop", "characters"),
]


@pytest.mark.parametrize(("kind", "fields", "param", "words"), REFUSED)
def test_each_number_past_its_limit_is_a_400_naming_the_field(
    kind: str, fields: dict[str, Any], param: str, words: str
) -> None:
    error = refused(kind, body_of(kind, fields))
    assert_openai_400(error, param)
    assert param in error.message
    assert words in error.message


def test_a_refused_seed_is_a_400_in_openais_shape_over_http() -> None:
    """Through the app, as a client sees it: JSON, status 400, the field named (a seed of
    2**64 was a 500 here, and on the wire a router's undoing)."""
    with TestClient(build_app(_gateway())) as http:
        r = http.post("/v1/chat/completions", content=chat(seed=2**64))
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "seed"
        assert r.json()["error"]["type"] == "invalid_request_error"


# -- bodies that do not parse ---------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "messages": ' + b"[" * 1200 + b"]" * 1200 + b"}",
        b"[" * 1200 + b"]" * 1200,
        b'{"a":' * 1200 + b"1" + b"}" * 1200,
        b"{nope",
        b"\xff\xfe",
        b"",
    ],
    ids=["messages-1200-deep", "array-1200-deep", "object-1200-deep", "broken", "binary", "empty"],
)
def test_a_body_that_does_not_parse_is_a_400_in_openais_shape(body: bytes) -> None:
    assert_openai_400(refused("chat", body), None)


def test_a_body_nested_1200_deep_is_a_400_over_http_not_a_plain_text_500() -> None:
    nested = b'{"model": "ncm-base", "messages": ' + b"[" * 1200 + b"]" * 1200 + b"}"
    with TestClient(build_app(_gateway()), raise_server_exceptions=False) as http:
        r = http.post("/v1/chat/completions", content=nested)
        assert r.status_code == 400
        assert r.headers["content-type"] == "application/json"
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_a_body_the_decoder_takes_is_a_400_from_however_deep_a_stack() -> None:
    """The decoder's depth limit is the interpreter's, less the stack already in use: a
    body that decodes in a test may not in a server's handler, and is the body's fault
    there too."""

    def at(frames: int) -> ApiError:
        return at(frames - 1) if frames else refused("chat", body)

    body = b'{"model": "ncm-base", "messages": ' + b"[" * 700 + b"]" * 700 + b"}"
    assert_openai_400(at(400), None)


# -- tools, checked as response_format is -----------------------------------------------


def tool(name: str, parameters: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, **extra}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.mark.parametrize("choice", [None, "auto", "required", "none"])
@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        ({"type": "object", "properties": {"a": {"type": "strng"}}}, "strng"),
        ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}}, "regex"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "missing"),
        (_nested(300), "recursion"),
    ],
)
def test_a_tool_schema_the_grammar_library_refuses_is_a_400_on_tools_naming_the_function(
    parameters: dict[str, Any], words: str, choice: str | None
) -> None:
    fields: dict[str, Any] = {"tools": [tool("fine", CITY), tool("broken", parameters)]}
    if choice is not None:
        fields["tool_choice"] = choice
    error = refused("chat", chat(**fields))
    assert_openai_400(error, "tools")
    assert "tools[1]" in error.message
    assert "'broken'" in error.message
    assert words in error.message
    # Said in the client's terms: none of the grammar the gateway would have built.
    assert "%json" not in error.message
    assert "start:" not in error.message


def test_tools_over_what_a_request_carries_are_a_400_on_tools() -> None:
    """Past :data:`MAX_SCHEMA_CHARS` as JSON: refused here, in words, not by the router
    as ``infer: Expected str of length <= 32768``."""
    big = {"type": "object", "description": "x" * (MAX_SCHEMA_CHARS // 2)}
    error = refused("chat", chat(tools=[tool("a", big), tool("b", big)]))
    assert_openai_400(error, "tools")
    assert str(MAX_SCHEMA_CHARS) in error.message
    # Short descriptions, but parameters that make a grammar past it.
    wide = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string"} for i in range(MAX_SCHEMA_CHARS // 64)},
    }
    error = refused("chat", chat(tools=[tool(f"f{i}", wide) for i in range(3)]))
    assert_openai_400(error, "tools")


def test_tools_the_wire_would_refuse_are_a_400_on_tools_not_a_500() -> None:
    """Whatever the wire holds a request's tools to beyond the checks here (their depth,
    say) is still the request's fault."""
    deep = _nested(MAX_TOOL_DEPTH)
    error = refused("chat", chat(tools=[tool("deep", deep)]))
    assert_openai_400(error, "tools")
    assert "deep" in error.message


def test_tool_count_and_names_are_held_to_openais_rules() -> None:
    many = [tool(f"f{i}") for i in range(MAX_TOOLS + 1)]
    assert_openai_400(refused("chat", chat(tools=many)), "tools")
    assert parse("chat", chat(tools=many[:MAX_TOOLS])).tooling is not None
    for name in ("", "has space", "x" * 65, "dotted.name"):
        error = refused("chat", chat(tools=[tool(name)]))
        assert_openai_400(error, "tools[0].function.name")
    assert parse("chat", chat(tools=[tool("a-B_9" + "x" * 59)])).tooling is not None


def test_tools_that_pass_reach_the_wire_without_the_fields_a_client_left_out() -> None:
    """No ``"description": null``: the wire's tools carry strings or nothing."""
    p = parse("chat", chat(tools=[tool("get_time"), tool("where", CITY, description="a city")]))
    declared = json.loads(p.request.tools)
    assert declared[0] == {"type": "function", "function": {"name": "get_time"}}
    assert declared[1]["function"] == {"name": "where", "parameters": CITY, "description": "a city"}
    msgspec.json.decode(msgspec.json.encode(p.request), type=InferRequest)


# -- helpers -----------------------------------------------------------------------------


def _gateway() -> Gateway:
    """A gateway with no bus behind it: enough for whatever is refused before the swarm
    is asked."""
    return Gateway(
        bridge=Bridge(Client()),
        auth=OpenAccess(),
        watch=SwarmWatch(),
        metrics=Metrics(CollectorRegistry()),
        log=logging.getLogger("hecate.test.gateway"),
    )
