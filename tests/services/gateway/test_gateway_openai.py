"""OpenAI's API as the gateway speaks it, without a socket: what a request may ask, the
swarm request it becomes, the errors a client sees, and every byte of a streamed answer.

Response shapes are checked against the official ``openai`` package's own models, so a
field the client needs that is missing or mistyped fails here."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import msgspec
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai._streaming import AsyncStream
from openai.types import Completion as OpenAICompletion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from hecate.wire.messages import (
    Candidate,
    ChatMessage,
    ErrorBody,
    InferReply,
    OutputFormat,
    TokenLogprob,
)
from hecate_gateway import shapes
from hecate_gateway.bridge import TicketMemory
from hecate_gateway.completion import _with_retry_after
from hecate_gateway.openai import (
    DEFAULT_MAX_TOKENS,
    TOLERATED,
    ApiError,
    parse,
    swarm_error,
)
from hecate_gateway.tools import CallStream, Mode, calls_in

CHAT = {"model": "ncm-base", "messages": [{"role": "user", "content": "hi"}]}


def chat(**fields: Any) -> bytes:
    return json.dumps({**CHAT, **fields}).encode()


def completion(**fields: Any) -> bytes:
    return json.dumps({"model": "ncm-base", "prompt": "once", **fields}).encode()


def refused(kind: str, body: bytes) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse(kind, body)  # type: ignore[arg-type]
    return caught.value


# -- requests ---------------------------------------------------------------------------


def test_a_chat_request_becomes_messages_and_a_rendered_prompt_with_the_swarm_defaults() -> None:
    p = parse(
        "chat",
        chat(
            messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
        ),
    )
    r = p.request
    assert r.messages == [
        ChatMessage(role="system", content="be brief"),
        ChatMessage(role="user", content="hi"),
    ]
    assert r.prompt == "system: be brief\nuser: hi\nassistant:"  # for prompt-only models
    assert (r.max_tokens, r.temperature, r.top_p, r.seed, r.stop) == (
        DEFAULT_MAX_TOKENS,
        0.0,
        1.0,
        None,
        [],
    )
    assert (p.model, p.stream, p.include_usage) == ("ncm-base", False, False)


def test_every_supported_field_reaches_the_swarm_request() -> None:
    p = parse(
        "chat",
        chat(
            max_completion_tokens=7,
            max_tokens=99,
            temperature=0.7,
            top_p=0.9,
            seed=42,
            stop="\n\n",
            user="u-1",
            stream=True,
            stream_options={"include_usage": True},
        ),
    )
    r = p.request
    # max_completion_tokens is the newer name and wins over max_tokens
    assert (r.max_tokens, r.temperature, r.top_p, r.seed, r.stop) == (7, 0.7, 0.9, 42, ["\n\n"])
    assert p.stream
    assert p.include_usage
    assert p.stop == ("\n\n",)


def test_completions_take_a_prompt_or_a_list_of_exactly_one() -> None:
    assert parse("completion", completion()).request.prompt == "once"
    assert parse("completion", completion(prompt=["twice"])).request.prompt == "twice"
    assert parse("completion", completion()).request.max_tokens == 16  # OpenAI's default
    assert parse("completion", completion()).request.messages is None
    assert refused("completion", completion(prompt=["a", "b"])).param == "prompt"
    assert refused("completion", completion(prompt=[1, 2])).param == "prompt[0]"


def test_roles_and_content_parts() -> None:
    p = parse(
        "chat",
        chat(
            messages=[
                {"role": "developer", "content": "x"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ]
        ),
    )
    assert p.request.messages == [
        ChatMessage(role="system", content="x"),
        ChatMessage(role="user", content="ab"),
    ]
    # A tool's answer goes back to the model in a user turn, as it was given the tools.
    tool = parse("chat", chat(messages=[{"role": "tool", "tool_call_id": "c", "content": "9"}]))
    assert tool.request.messages == [
        ChatMessage(role="user", content="<tool_response>\n9\n</tool_response>")
    ]
    robot = refused("chat", chat(messages=[{"role": "robot", "content": "x"}]))
    assert (robot.status, robot.param) == (400, "messages[0].role")
    image = [{"type": "image_url", "image_url": {"url": "data:"}}]
    assert refused("chat", chat(messages=[{"role": "user", "content": image}])).param == (
        "messages[0].content"
    )
    assert refused("chat", chat(messages=[])).param == "messages"
    assert refused("chat", chat(messages=[{"role": "user", "content": 3}])).param == (
        "messages[0].content"
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 2),
        ("tools", [{"type": "file_search"}]),
        ("tool_choice", "required"),  # without tools
        ("functions", [{"name": "f"}]),
        ("top_logprobs", 3),  # without logprobs: true
        ("top_logprobs", 21),
        ("response_format", {"type": "xml"}),
        ("logit_bias", {"50256": -100}),
        ("presence_penalty", 0.5),
        ("frequency_penalty", -1),
        ("modalities", ["text", "audio"]),
        ("store", True),
    ],
)
def test_what_the_swarm_cannot_honour_is_a_400_naming_the_field(field: str, value: Any) -> None:
    error = refused("chat", chat(**{field: value}))
    assert (error.status, error.type) == (400, "invalid_request_error")
    assert (error.param or "").split(".")[0].split("[")[0] == field
    assert field in error.message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 1),
        ("tools", []),
        ("tool_choice", "none"),
        ("logprobs", False),
        ("presence_penalty", 0),
        ("frequency_penalty", 0.0),
        ("response_format", {"type": "text"}),
        ("parallel_tool_calls", True),
        ("service_tier", "auto"),
        ("logit_bias", {}),
    ],
)
def test_the_same_fields_at_their_off_value_are_accepted(field: str, value: Any) -> None:
    assert field not in TOLERATED or TOLERATED[field](value)
    parse("chat", chat(**{field: value}))


@pytest.mark.parametrize(
    ("kind", "body", "param"),
    [
        ("chat", chat(frobnicate=1), "frobnicate"),
        ("completion", completion(tools=[]), "tools"),  # a chat-only field
        ("chat", chat(echo=False), "echo"),  # a completions-only field
        ("chat", chat(max_tokens="8"), "max_tokens"),
        ("chat", chat(max_tokens=0), "max_tokens"),
        ("chat", chat(max_tokens=5000), "max_tokens"),
        ("chat", chat(max_completion_tokens=0), "max_completion_tokens"),
        ("chat", chat(temperature=2.5), "temperature"),
        ("chat", chat(top_p=0), "top_p"),
        ("chat", chat(stop=["a", "b", "c", "d", "e"]), "stop"),
        ("chat", chat(stream_options={"include_usage": True}), "stream_options"),
        ("chat", b'{"messages": []}', "model"),
        ("chat", chat(messages=[{"role": 1, "content": "x"}]), "messages[0].role"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(kind: str, body: bytes, param: str) -> None:
    error = refused(kind, body)
    assert (error.status, error.param) == (400, param)
    assert error.body() == {
        "error": {"message": error.message, "type": "invalid_request_error", "param": param,
                  "code": None}
    }  # fmt: skip


def test_a_body_that_is_not_a_json_object_is_a_400() -> None:
    assert refused("chat", b"{nope").status == 400
    assert refused("chat", b"[1]").status == 400


def test_a_model_id_no_swarm_could_serve_is_a_404_without_asking() -> None:
    error = refused("chat", chat(model="gpt-4o.mini"))
    assert (error.status, error.code, error.param) == (404, "model_not_found", "model")


def test_a_prompt_longer_than_a_request_carries_is_context_length_exceeded() -> None:
    error = refused("completion", completion(prompt="x" * (64 * 1024 + 1)))
    assert (error.status, error.code, error.param) == (400, "context_length_exceeded", "prompt")


# -- swarm errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status", "type_", "oa_code", "param"),
    [
        ("prompt_too_long", 400, "invalid_request_error", "context_length_exceeded", "messages"),
        ("payload_too_large", 400, "invalid_request_error", "context_length_exceeded", "messages"),
        ("bad_request", 400, "invalid_request_error", None, None),
        ("no_such_model", 404, "invalid_request_error", "model_not_found", "model"),
        ("rate_limited", 429, "requests", "rate_limit_exceeded", None),
        ("unrecoverable", 503, "server_error", "unrecoverable", None),
        ("no_healthy_pipeline", 503, "server_error", "no_healthy_pipeline", None),
        ("no_plan", 503, "server_error", "no_plan", None),
        ("no_responders", 503, "server_error", "no_router", None),
        ("unknown_node", 503, "server_error", "unknown_node", None),
        ("timeout", 504, "server_error", "timeout", None),
        ("internal", 500, "server_error", "internal", None),
        ("something_new", 500, "server_error", "something_new", None),
    ],
)
def test_swarm_errors_map_to_openai_statuses(
    code: str, status: int, type_: str, oa_code: str | None, param: str | None
) -> None:
    error = swarm_error(code, "why", kind="chat")
    assert (error.status, error.type, error.code, error.param) == (status, type_, oa_code, param)


def test_a_generation_that_broke_carries_its_partial_text() -> None:
    error = swarm_error("unrecoverable", "lost", kind="chat", partial="Once upon")
    assert error.body()["error"]["partial_output"] == "Once upon"
    assert "partial_output" not in swarm_error("unrecoverable", "lost", kind="chat").body()["error"]


@pytest.mark.parametrize(
    ("wait_s", "ms", "seconds"), [(0.3, "300", "1"), (1.2342, "1235", "2"), (5.0, "5000", "5")]
)
def test_a_429_says_the_booked_slot_in_ms_and_whole_seconds_rounded_up(
    wait_s: float, ms: str, seconds: str
) -> None:
    error = _with_retry_after(swarm_error("rate_limited", "slow down", kind="chat"), wait_s)
    assert dict(error.headers) == {"retry-after-ms": ms, "Retry-After": seconds}


# -- responses ---------------------------------------------------------------------------


def reply(**fields: Any) -> InferReply:
    return InferReply(ok=True, **fields)


def test_an_answer_cuts_at_a_stop_string_and_counts_what_the_swarm_reported() -> None:
    a = shapes.answer_of(
        reply(
            output="one two. three", prompt_tokens=5, completion_tokens=3, finish_reason="length"
        ),
        (".",),
    )
    assert (a.text, a.finish_reason) == ("one two", "stop")
    assert a.usage() == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    # a model that reports nothing: zeros, or the tokens that were streamed
    assert shapes.answer_of(reply(output="x"), ()).usage()["total_tokens"] == 0
    assert shapes.answer_of(reply(output="x y"), (), streamed=2).completion_tokens == 2
    assert shapes.answer_of(reply(output="x", finish_reason="length"), ()).finish_reason == "length"


def test_whole_responses_have_openais_shapes() -> None:
    a = shapes.Answer(text="Paris", finish_reason="stop", prompt_tokens=4, completion_tokens=1)
    c = ChatCompletion.model_validate_json(shapes.body("chat", "chatcmpl-1", 7, "m", a))
    assert (c.id, c.object, c.created, c.model) == ("chatcmpl-1", "chat.completion", 7, "m")
    assert c.choices[0].message.content == "Paris"
    assert c.choices[0].message.role == "assistant"
    assert c.choices[0].finish_reason == "stop"
    assert c.usage is not None
    assert c.usage.total_tokens == 5
    t = OpenAICompletion.model_validate_json(shapes.body("completion", "cmpl-1", 7, "m", a))
    assert (t.object, t.choices[0].text, t.choices[0].finish_reason) == (
        "text_completion",
        "Paris",
        "stop",
    )
    assert shapes.response_id("chat", "ab") == "chatcmpl-ab"
    assert shapes.response_id("completion", "ab") == "cmpl-ab"


def events(stream: bytes) -> list[str]:
    assert stream.endswith(b"\n\n")
    out = []
    for frame in stream.split(b"\n\n")[:-1]:
        assert frame.startswith(b"data: ")
        assert b"\n" not in frame
        out.append(frame[6:].decode())
    return out


def test_a_streamed_chat_answer_frame_by_frame() -> None:
    f = shapes.Frames("chat", "chatcmpl-9", 11, "m", include_usage=False)
    a = shapes.Answer(text="Hi there", finish_reason="length", prompt_tokens=3, completion_tokens=2)
    stream = f.start() + f.delta("Hi") + f.delta("") + f.delta(" there") + f.end(a, True, "a,b")
    data = events(stream)
    assert data[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(d) for d in data[:-1]]
    assert {(c.id, c.created, c.object) for c in chunks} == {
        ("chatcmpl-9", 11, "chat.completion.chunk")
    }
    first, *contents, last = chunks
    assert first.choices[0].delta.role == "assistant"
    assert first.choices[0].delta.content == ""
    assert [c.choices[0].delta.content for c in contents] == ["Hi", " there"]
    assert all(c.choices[0].delta.role is None for c in contents)
    assert all(c.choices[0].finish_reason is None for c in [first, *contents])
    assert last.choices[0].finish_reason == "length"
    assert json.loads(data[-2])["choices"][0]["delta"] == {}
    assert last.model_extra == {"hecate": {"degraded": True, "route": "a,b"}}
    assert all("usage" not in json.loads(d) for d in data[:-1])


def test_with_include_usage_every_chunk_has_usage_null_and_a_last_one_has_it() -> None:
    f = shapes.Frames("chat", "chatcmpl-9", 11, "m", include_usage=True)
    a = shapes.Answer(text="Hi", finish_reason="stop", prompt_tokens=3, completion_tokens=1)
    data = events(f.start() + f.delta("Hi") + f.end(a, False, "gpu"))
    docs = [json.loads(d) for d in data[:-1]]
    assert [d["usage"] for d in docs[:-1]] == [None, None, None]
    assert docs[-1]["choices"] == []
    assert docs[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    assert ChatCompletionChunk.model_validate_json(data[-2]).usage is not None


def test_a_streamed_completion_has_text_chunks_and_no_role() -> None:
    f = shapes.Frames("completion", "cmpl-9", 11, "m", include_usage=False)
    a = shapes.Answer(text="ab", finish_reason="stop", prompt_tokens=0, completion_tokens=0)
    assert f.start() == b""
    data = events(f.delta("ab") + f.end(a, False, ""))
    # As OpenAI streams them (its client reads chunks without validating: the pydantic
    # model says finish_reason is never null, but in a stream it is until the end).
    chunks = [json.loads(d) for d in data[:-1]]
    assert [c["choices"][0]["text"] for c in chunks] == ["ab", ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, "stop"]
    assert {c["object"] for c in chunks} == {"text_completion"}
    OpenAICompletion.model_validate_json(data[-2])


def test_an_error_after_the_stream_began_is_an_error_event_without_done() -> None:
    frame = shapes.Frames.error(swarm_error("unrecoverable", "lost gpu", kind="chat"))
    (data,) = events(frame)
    assert json.loads(data) == {
        "error": {"message": "lost gpu", "type": "server_error", "param": None,
                  "code": "unrecoverable"}
    }  # fmt: skip


# -- streaming text around stop strings --------------------------------------------------

words = st.text(alphabet="ab\n.", min_size=0, max_size=4)


@given(
    pieces=st.lists(words, max_size=12),
    stop=st.lists(st.text("ab\n.", min_size=1, max_size=3), max_size=3),
)
def test_streamed_text_never_runs_past_the_answer_and_adds_up_to_it(
    pieces: list[str], stop: list[str]
) -> None:
    """The router streams tokens until the text so far contains a stop string, which it
    does not stream, and answers the text before the first stop string: whatever the
    tokens, what was sent is always a prefix of that answer, and sent plus the rest at
    the end is exactly it."""
    text, streamed = "", []
    for piece in pieces:
        if any(s in text + piece for s in stop):
            text += piece
            break
        text += piece
        streamed.append(piece)
    output = shapes.cut_at_stop(text, tuple(stop))[0]
    s = shapes.StreamText(tuple(stop))
    sent = ""
    for piece in streamed:
        sent += s.add(piece)
        assert output.startswith(sent)
    assert sent + s.finish(output) == output


def test_only_a_possible_start_of_a_stop_string_is_held_back() -> None:
    s = shapes.StreamText(("\n\n",))
    assert s.add("one\n") == "one"
    assert s.add("two") == "\ntwo"
    assert s.finish("one\ntwo") == ""
    assert shapes.StreamText(()).add("a\n") == "a\n"


# -- the ticket of a refused request, for its client's retry ------------------------------


def test_a_retry_of_the_same_body_gets_its_ticket_once_and_in_order() -> None:
    t = TicketMemory(grace_s=10)
    t.remember("acme", "h", 7, 5.0, now=100.0)
    t.remember("acme", "h", 8, 6.0, now=100.0)
    assert t.take("other", "h", 101.0) is None  # another tenant's identical body
    assert t.take("acme", "other", 101.0) is None
    assert t.take("acme", "h", 105.0) == 7
    assert t.take("acme", "h", 105.0) == 8
    assert t.take("acme", "h", 105.0) is None
    t.remember("acme", "h", 9, 5.0, now=100.0)
    assert t.take("acme", "h", 115.1) is None  # its slot passed long ago
    assert len(t) == 0


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 5)), max_size=60))
def test_ticket_memory_stays_within_its_limit(entries: list[tuple[str, int]]) -> None:
    t = TicketMemory(limit=8)
    for i, (tenant, body) in enumerate(entries):
        t.remember(tenant, str(body), i, 1.0, now=0.0)
        assert len(t) <= 8
    kept = sum(
        t.take(tenant, str(b), 0.0) is not None
        for tenant in "abc"
        for b in range(6)
        for _ in range(60)
    )
    assert kept == min(8, len(entries))


def test_error_replies_decode_as_the_swarm_sends_them() -> None:
    """The field the bridge reads a 429's slot from, as a router encodes it."""
    body = msgspec.json.encode(
        InferReply(
            ok=False,
            error=ErrorBody(code="rate_limited", message="m", retry_after_s=2.5),
            retry_after_s=2.5,
            quota_ticket=3,
        )
    )
    back = msgspec.json.decode(body, type=InferReply)
    assert (back.retry_after_s, back.quota_ticket) == (2.5, 3)


async def test_the_official_client_raises_on_an_error_event_after_the_text_so_far() -> None:
    """openai-python's own stream reader, fed the bytes a broken generation sends: the
    deltas before the break arrive, then an ``APIError`` with the code and the partial
    text."""
    frames = shapes.Frames("chat", "chatcmpl-1", 1, "m", include_usage=False)
    broke = swarm_error("unrecoverable", "lost gpu", kind="chat", partial="Once")
    body = frames.start() + frames.delta("Once") + shapes.Frames.error(broke)
    url = "http://gateway/v1/chat/completions"
    response = httpx2.Response(
        200,
        content=body,
        headers={"content-type": "text/event-stream"},
        request=httpx2.Request("POST", url),
    )
    async with openai.AsyncOpenAI(api_key="k", base_url="http://gateway/v1") as client:
        stream = AsyncStream(cast_to=ChatCompletionChunk, response=response, client=client)
        got: list[str | None] = []

        async def read() -> None:
            async for chunk in stream:
                got.append(chunk.choices[0].delta.content)

        with pytest.raises(openai.APIError) as caught:
            await read()
    assert got == ["", "Once"]
    assert (caught.value.code, caught.value.type) == ("unrecoverable", "server_error")
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["partial_output"] == "Once"


# -- structured output and log-probabilities ---------------------------------------------

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_a_response_format_becomes_the_shape_the_swarm_enforces() -> None:
    assert parse("chat", chat(response_format={"type": "text"})).request.output_format is None
    obj = parse("chat", chat(response_format={"type": "json_object"})).request.output_format
    assert obj == OutputFormat(type="json_object")
    asked = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}}
    shape = parse("chat", chat(response_format=asked)).request.output_format
    assert shape is not None
    assert shape.type == "json_schema"
    assert json.loads(shape.schema) == PERSON


@pytest.mark.parametrize(
    ("response_format", "param", "words"),
    [
        ({"type": "json_schema"}, "response_format.json_schema.schema", "is required"),
        (
            {"type": "json_schema", "json_schema": {"name": "p"}},
            "response_format.json_schema.schema",
            "is required",
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {
                    "name": "p",
                    "schema": {"type": "object", "properties": {"a": {"type": "strng"}}},
                },
            },
            "response_format.json_schema.schema",
            "cannot be followed",
        ),
        ({"type": "grammar"}, "response_format.type", "is not one of"),
    ],
)
def test_a_shape_the_grammar_library_cannot_follow_is_a_400_naming_the_part(
    response_format: dict[str, Any], param: str, words: str
) -> None:
    error = refused("chat", chat(response_format=response_format))
    assert (error.status, error.param) == (400, param)
    assert words in error.message


def test_log_probabilities_are_asked_as_openai_asks_them() -> None:
    assert parse("chat", chat()).request.logprobs is None
    assert parse("chat", chat(logprobs=False)).request.logprobs is None
    assert parse("chat", chat(logprobs=True)).request.logprobs == 0
    assert parse("chat", chat(logprobs=True, top_logprobs=5)).request.logprobs == 5
    assert parse("completion", completion(logprobs=3)).request.logprobs == 3
    assert refused("completion", completion(logprobs=6)).param == "logprobs"
    assert refused("completion", completion(response_format={"type": "json_object"})).param == (
        "response_format"
    )


ENTRIES = [
    TokenLogprob(1, b"Par", -0.25, [Candidate(1, b"Par", -0.25), Candidate(9, b" Lyon", -2.0)]),
    TokenLogprob(
        2, b"\xe2\x82", -1.5, [Candidate(2, b"\xe2\x82", -1.5), Candidate(3, b"is", -3.0)]
    ),
]


def test_whole_answers_carry_logprobs_in_openais_shapes() -> None:
    answer = shapes.Answer("Par\u20ac", "stop", 3, 2, logprobs=ENTRIES)
    c = ChatCompletion.model_validate_json(shapes.body("chat", "id", 1, "m", answer))
    content = c.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None
    assert [(e.token, e.logprob, e.bytes) for e in content] == [
        ("Par", -0.25, [80, 97, 114]),
        ("\\xe2\\x82", -1.5, [226, 130]),
    ]
    assert [t.token for t in content[0].top_logprobs] == ["Par", " Lyon"]
    t = OpenAICompletion.model_validate_json(shapes.body("completion", "id", 1, "m", answer))
    lp = t.choices[0].logprobs
    assert lp is not None
    assert lp.tokens == ["Par", "\\xe2\\x82"]
    assert lp.token_logprobs == [-0.25, -1.5]
    assert lp.text_offset == [0, 3]
    assert lp.top_logprobs == [{"Par": -0.25, " Lyon": -2.0}, {"\\xe2\\x82": -1.5, "is": -3.0}]
    plain = shapes.Answer("x", "stop", 1, 1)
    assert json.loads(shapes.body("chat", "id", 1, "m", plain))["choices"][0]["logprobs"] is None


def test_a_stream_carries_each_tokens_logprob_in_the_frame_of_its_text() -> None:
    frames = shapes.Frames("completion", "id", 1, "m", include_usage=False)
    first = json.loads(frames.delta("Par", ENTRIES[:1])[len(b"data: ") :])
    second = json.loads(frames.delta("\u20ac", ENTRIES[1:])[len(b"data: ") :])
    assert first["choices"][0]["logprobs"]["text_offset"] == [0]
    assert second["choices"][0]["logprobs"]["text_offset"] == [3]  # counted from the start
    chunk = ChatCompletionChunk.model_validate_json(
        shapes.Frames("chat", "id", 1, "m", include_usage=False).delta("Par", ENTRIES[:1])[6:]
    )
    assert chunk.choices[0].logprobs is not None


# -- tool calls ---------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


def test_tools_go_to_the_first_stage_and_the_choice_sets_the_answers_shape() -> None:
    auto = parse("chat", chat(tools=[WEATHER, CLOCK]))
    assert auto.tooling is not None
    assert auto.tooling.mode == "auto"
    assert auto.request.output_format is not None
    assert auto.request.output_format.type == "lark"
    # The tools as declared, for the model's own template (or the Hermes block) to tell.
    assert [t["function"]["name"] for t in json.loads(auto.request.tools)] == [
        "get_weather",
        "get_time",
    ]
    assert [m.role for m in auto.request.messages or []] == ["user"]  # nothing added here
    required = parse("chat", chat(tools=[WEATHER, CLOCK], tool_choice="required"))
    assert required.request.output_format is not None
    assert required.request.output_format.type == "json_schema"
    named = {"type": "function", "function": {"name": "get_time"}}
    one = parse("chat", chat(tools=[WEATHER, CLOCK], tool_choice=named)).request.output_format
    assert one is not None
    assert "get_time" in one.schema
    assert "get_weather" not in one.schema
    none = parse("chat", chat(tools=[WEATHER], tool_choice="none"))
    assert (none.tooling, none.request.output_format) == (None, None)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1]"),
        ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
    ],
)  # fmt: skip
def test_a_tool_request_that_cannot_be_honoured_is_a_400_naming_the_part(
    fields: dict[str, Any], param: str
) -> None:
    assert refused("chat", chat(**fields)).param == param


def test_a_conversation_with_calls_and_their_answers_is_given_back_as_the_model_writes_it() -> None:
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}  # fmt: skip
    p = parse(
        "chat",
        chat(
            tools=[WEATHER],
            messages=[
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "-3 C"},
            ],
        ),
    )
    said = [m.content for m in p.request.messages or []]
    assert (
        said[1]
        == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    )
    assert said[2] == "<tool_response>\n-3 C\n</tool_response>"


def test_an_answer_that_is_a_call_comes_back_as_tool_calls() -> None:
    reply = InferReply(ok=True, output='{"name":"get_weather","arguments":{"city":"Oslo"}}')
    required = parse("chat", chat(tools=[WEATHER], tool_choice="required")).tooling
    answer = shapes.answer_of(reply, (), tooling=required, call_id="call_1")
    c = ChatCompletion.model_validate_json(shapes.body("chat", "id", 1, "m", answer))
    assert c.choices[0].finish_reason == "tool_calls"
    assert c.choices[0].message.content is None
    [call] = c.choices[0].message.tool_calls or []
    assert (call.id, call.function.name) == ("call_1", "get_weather")  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Oslo"}  # type: ignore[union-attr]
    auto = parse("chat", chat(tools=[WEATHER])).tooling
    text = InferReply(ok=True, output="It is cold.")
    assert shapes.answer_of(text, (), tooling=auto).tool_calls is None
    tagged = InferReply(
        ok=True, output='<tool_call>\n{"name":"get_weather","arguments":{}}\n</tool_call>'
    )
    assert shapes.answer_of(tagged, (), tooling=auto).finish_reason == "tool_calls"
    cut = InferReply(ok=True, output='<tool_call>\n{"name":"get_wea', finish_reason="length")
    assert shapes.answer_of(cut, (), tooling=auto).finish_reason == "length"


@given(cuts=st.lists(st.integers(1, 9), min_size=1, max_size=40), auto=st.booleans())
def test_a_streamed_call_names_its_function_first_and_its_fragments_add_up(
    cuts: list[int], auto: bool
) -> None:
    """Whatever the tokens' sizes: one first delta with the id and name, then argument
    fragments that add up to the call's arguments, in frames the SDK reads."""
    body = '{"name":"get_weather","arguments":{"city":"O\\"slo","n":[1,2]}}'
    text = f"<tool_call>\n{body}\n</tool_call>" if auto else body
    mode: Mode = "auto" if auto else "required"
    stream, at = CallStream(mode, "call_1"), 0
    deltas: list[dict[str, Any]] = []
    for cut in [*cuts, len(text)]:
        came = stream.add(text[at : at + cut])
        assert came is not None, "a call is never taken for text"
        deltas += came
        at += cut
    [call] = calls_in(text, mode, "call_1") or []
    deltas += stream.finish(call)
    assert deltas[0]["id"] == "call_1"
    assert deltas[0]["function"]["name"] == "get_weather"
    assert all("id" not in d and "name" not in d["function"] for d in deltas[1:])
    assert "".join(d["function"]["arguments"] for d in deltas) == call.function.arguments
    assert json.loads(call.function.arguments) == {"city": 'O"slo', "n": [1, 2]}
    plain = CallStream("auto", "call_2")
    assert plain.add("<tool") == []  # it may yet begin a call: held
    assert plain.add("s are") is None  # it did not: text from here on
    assert plain.add("<tool_call>\n") is None
    frame = shapes.Frames("chat", "id", 1, "m", include_usage=False).calls(deltas)
    chunk = ChatCompletionChunk.model_validate_json(frame[len(b"data: ") :])
    assert [d.index for d in chunk.choices[0].delta.tool_calls or []] == [0] * len(deltas)
