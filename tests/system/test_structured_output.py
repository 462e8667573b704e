"""Structured answers and log-probabilities through the HTTP gateway, to the official
``openai`` client and to LangChain, from a SmolLM2 swarm: every answer held to a JSON
Schema parses and validates, greedy or sampled, whole or streamed, and through the
SDK's own ``parse`` and LangChain's ``with_structured_output`` with a pydantic model;
log-probabilities come in OpenAI's shapes, one per token; a schema that cannot be
followed is a 400 naming it.

One node holds all 30 layers (one process to load)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pydantic
import pytest
from langchain_core.exceptions import OutputParserException
from langchain_openai import ChatOpenAI
from openai.types.chat import (
    ChatCompletionMessageParam,
    ChatCompletionToolChoiceOptionParam,
    ChatCompletionToolParam,
)
from openai.types.shared_params import ResponseFormatJSONSchema
from pydantic import SecretStr

from tests.support.gateways import llm_gateway

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

MODEL = "smollm2-135m"
CITY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "country": {"type": "string", "maxLength": 24},
        # Bounded: a small model may write one digit after another for ever.
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 100},
        "landmarks": {
            "type": "array",
            "items": {"type": "string", "maxLength": 24},
            "maxItems": 3,
        },
    },
    "required": ["city", "country", "population_millions", "landmarks"],
    "additionalProperties": False,
}
ASKED: ResponseFormatJSONSchema = {
    "type": "json_schema",
    "json_schema": {"name": "city", "schema": CITY, "strict": True},
}
#: Asked for a JSON object: a 135M model closes some and repeats itself in others.
JSON_PROMPTS = [
    "List two colours as JSON.",
    "Give a JSON object with one key, ok, set to true.",
    "Describe a cat in JSON.",
    "What is the capital of France? Answer in JSON.",
]

PROMPTS = [
    "Tell me about Paris.",
    "Describe Tokyo.",
    "What do you know about Lagos?",
    "Give me facts on Lima.",
    "Describe the capital of Italy.",
    "Write about a small town you like.",
]


class Pet(pydantic.BaseModel):
    # No other keys (additionalProperties: false): else a small model may go on adding
    # keys until max_tokens cuts the JSON, whichever client asks.
    model_config = pydantic.ConfigDict(extra="forbid")

    name: str = pydantic.Field(max_length=16)
    species: str = pydantic.Field(max_length=16)
    age_years: int = pydantic.Field(ge=0, le=50)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with llm_gateway(tmp_path_factory.mktemp("structured"), MODEL) as urls:
        yield urls


def client(gateway: tuple[str, str]) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gateway[1]}/v1", api_key="unused", timeout=120)


async def _ask(api: openai.AsyncOpenAI, prompt: str, temperature: float, seed: int) -> str:
    reply = await api.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        response_format=ASKED,
        temperature=temperature,
        seed=seed,
        max_tokens=160,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    return choice.message.content or ""


async def test_every_answer_held_to_a_schema_parses_and_validates(
    gateway: tuple[str, str],
) -> None:
    api = client(gateway)
    asks = [(p, t, s) for s, p in enumerate(PROMPTS) for t in (0.0, 0.9)]
    answers = await asyncio.gather(*(_ask(api, p, t, s) for p, t, s in asks))
    for (prompt, temperature, _), text in zip(asks, answers, strict=True):
        try:
            jsonschema.validate(json.loads(text), CITY)
        except (ValueError, jsonschema.ValidationError) as exc:
            pytest.fail(f"{prompt!r} at {temperature}: {text!r}: {exc}")
    free = await api.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=24
    )
    assert free.choices[0].message.content not in answers  # the shape was the schema's doing


async def test_a_json_object_and_a_streamed_schema_answer_parse(gateway: tuple[str, str]) -> None:
    api = client(gateway)
    ended = 0
    for prompt in JSON_PROMPTS:
        whole = await api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            response_format={"type": "json_object"},
            max_tokens=120,
        )
        choice = whole.choices[0]
        if choice.finish_reason == "stop":  # the JSON ended: it is whole
            assert isinstance(json.loads(choice.message.content or ""), dict)
            ended += 1
        else:  # a small model may repeat itself until max_tokens cuts the JSON
            assert choice.finish_reason == "length"
    assert ended
    stream = await api.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPTS[1]}],
        response_format=ASKED,
        max_tokens=160,
        stream=True,
    )
    pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert len([p for p in pieces if p]) > 3  # streamed, token by token
    jsonschema.validate(json.loads("".join(pieces)), CITY)


async def test_the_sdks_own_parse_returns_the_pydantic_model(gateway: tuple[str, str]) -> None:
    api = client(gateway)
    for content in ("My cat Tom is three.", "Describe a dog."):
        reply = await api.chat.completions.parse(
            model=MODEL,
            messages=[{"role": "user", "content": content}],
            response_format=Pet,
            max_tokens=120,
        )
        pet = reply.choices[0].message.parsed
        assert isinstance(pet, Pet)


async def test_log_probabilities_come_one_per_token_in_openais_shapes(
    gateway: tuple[str, str],
) -> None:
    api = client(gateway)
    chat = await api.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=8,
        logprobs=True,
        top_logprobs=3,
    )
    choice, usage = chat.choices[0], chat.usage
    assert choice.logprobs is not None
    content = choice.logprobs.content
    assert content is not None
    assert usage is not None
    assert len(content) == usage.completion_tokens  # the end token is neither text nor counted
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.logprob <= 0
        # Greedy: the token is the most likely one.
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert entry.bytes == list(entry.token.encode()) or "\\x" in entry.token
    assert "".join(e.token for e in content) == choice.message.content
    stream = await api.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, logprobs=2, stream=True
    )
    tokens: list[str] = []
    text = ""
    async for chunk in stream:
        for c in chunk.choices:
            text += c.text
            if c.logprobs is not None and c.logprobs.tokens is not None:
                tokens += c.logprobs.tokens
                assert c.logprobs.top_logprobs is not None
                assert all(len(top) == 2 for top in c.logprobs.top_logprobs)
    assert len(tokens) == 6
    assert "".join(tokens) == text


async def test_a_schema_that_cannot_be_followed_is_a_400_naming_it(
    gateway: tuple[str, str],
) -> None:
    bad: dict[str, object] = {"type": "object", "properties": {"a": {"type": "strng"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        await client(gateway).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            response_format=ResponseFormatJSONSchema(
                type="json_schema", json_schema={"name": "x", "schema": bad}
            ),
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "response_format.json_schema.schema"
    assert "strng" in error["message"]


async def test_the_models_list_says_what_a_sampling_model_can_be_asked(
    gateway: tuple[str, str],
) -> None:
    async with httpx.AsyncClient(base_url=gateway[1]) as http:
        listed = (await http.get("/v1/models")).json()
    [model] = listed["data"]
    assert model["capabilities"] == {
        "response_format": ["text", "json_object", "json_schema"],
        "logprobs": True,
        "tools": True,
        "prefix_cache": True,
    }


def _langchain(gateway: tuple[str, str], max_tokens: int) -> ChatOpenAI:
    """LangChain's chat model on the gateway, with an HTTP client of its own: LangChain
    otherwise keeps one per process, tied to the event loop of the test that made it."""
    return ChatOpenAI(
        model=MODEL,
        base_url=f"{gateway[1]}/v1",
        api_key=SecretStr("unused"),
        temperature=0,
        max_completion_tokens=max_tokens,
        http_async_client=openai.DefaultAsyncHttpxClient(),
    )


async def test_langchains_structured_output_returns_the_pydantic_model(
    gateway: tuple[str, str],
) -> None:
    """LangChain's ``ChatOpenAI`` (a client nobody here wrote), as an application uses
    it: ``with_structured_output`` on a pydantic model, by JSON Schema and by JSON mode."""
    llm = _langchain(gateway, 120)
    by_schema = llm.with_structured_output(Pet, method="json_schema")
    for prompt in ("My cat Tom is three.", "Describe a dog called Rex."):
        pet = await by_schema.ainvoke(prompt)
        assert isinstance(pet, Pet)
    by_mode = llm.with_structured_output(method="json_mode")
    answers = []
    for prompt in JSON_PROMPTS:
        try:
            answers.append(await by_mode.ainvoke(prompt))
        except (OutputParserException, openai.LengthFinishReasonError):
            continue  # an answer max_tokens cut: the client's own error for it
    assert answers
    assert all(isinstance(a, dict) for a in answers)


WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a timezone",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 24}},
            "required": ["timezone"],
            "additionalProperties": False,
        },
    },
}
PARAMETERS = {
    "get_weather": WEATHER["function"].get("parameters"),
    "get_time": CLOCK["function"].get("parameters"),
}


def _valid_call(name: str, arguments: str) -> None:
    assert name in PARAMETERS
    jsonschema.validate(json.loads(arguments), PARAMETERS[name])


async def test_a_required_or_named_tool_call_names_a_declared_function_with_valid_arguments(
    gateway: tuple[str, str],
) -> None:
    api = client(gateway)
    asks: list[tuple[str, ChatCompletionToolChoiceOptionParam, float]] = [
        ("What's the weather in Paris?", "required", 0.0),
        ("Is it raining in Lima?", "required", 0.9),
        ("What time is it in Tokyo?", {"type": "function", "function": {"name": "get_time"}}, 0.0),
    ]
    for prompt, choice, temperature in asks:
        reply = await api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            tools=[WEATHER, CLOCK],
            tool_choice=choice,
            temperature=temperature,
            seed=7,
            max_tokens=80,
        )
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "tool_calls", message.content
        [call] = message.tool_calls or []
        assert call.type == "function"
        _valid_call(call.function.name, call.function.arguments)
        if isinstance(choice, dict):
            assert call.function.name == "get_time"


async def test_a_streamed_call_adds_up_and_its_answer_is_taken_back(
    gateway: tuple[str, str],
) -> None:
    api = client(gateway)
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "What's the weather in Oslo?"}
    ]
    stream = await api.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=80,
        stream=True,
    )
    name, arguments, call_id, finish = "", "", "", None
    async for chunk in stream:
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                call_id = d.id or call_id
                name += d.function.name or "" if d.function else ""
                arguments += d.function.arguments or "" if d.function else ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    _valid_call(name, arguments)
    messages += [
        {
            "role": "assistant",
            "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": name, "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "-3 celsius, snowing"},
    ]  # fmt: skip
    after = await api.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=24
    )
    assert after.choices[0].finish_reason in ("stop", "length")
    assert after.choices[0].message.content


async def test_with_auto_the_model_answers_in_text_or_with_a_valid_call(
    gateway: tuple[str, str],
) -> None:
    api = client(gateway)
    for prompt in ("Hello! How are you?", "What's the weather in Rome, in celsius?"):
        reply = await api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            tools=[WEATHER, CLOCK],
            max_tokens=80,
        )
        choice = reply.choices[0]
        if choice.finish_reason == "tool_calls":
            for call in choice.message.tool_calls or []:
                assert call.type == "function"
                _valid_call(call.function.name, call.function.arguments)
        else:
            assert choice.message.content
            assert "<tool_call>" not in choice.message.content


async def test_langchains_bind_tools_gets_calls_it_can_run(gateway: tuple[str, str]) -> None:
    llm = _langchain(gateway, 80)
    bound = llm.bind_tools([dict(WEATHER), dict(CLOCK)], tool_choice="required")
    message = await bound.ainvoke("What's the weather in Paris?")
    [call] = message.tool_calls
    assert call["name"] in PARAMETERS
    jsonschema.validate(call["args"], PARAMETERS[call["name"]])
    chunks = [chunk async for chunk in bound.astream("What time is it in Tokyo?")]
    streamed: Any = chunks[0]  # a chunk, whose sum LangChain's types do not follow
    for chunk in chunks[1:]:
        streamed += chunk
    [call] = streamed.tool_calls
    jsonschema.validate(call["args"], PARAMETERS[call["name"]])
