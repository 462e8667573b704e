"""OpenAI's HTTP API, as pure functions: request bodies in, ``InferRequest`` out; swarm
replies in, response bodies and SSE frames out. No I/O and no clock here (``created``
and ids are passed in), so every shape a client sees is tested without a socket.

What a client may send: ``model``, ``messages`` (chat) or ``prompt`` (completions),
``max_tokens`` / ``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``,
``stop``, ``user``, ``stream``, ``stream_options``; ``response_format`` (chat: ``text``,
``json_object``, or ``json_schema`` with its schema, enforced while the answer is
sampled; a schema the grammar library cannot follow is a 400 naming it),
``logprobs`` (chat: with ``top_logprobs``; completions: the number of likely tokens),
and, in chat, ``tools``, ``tool_choice`` and ``parallel_tool_calls``
(:mod:`hecate_gateway.tools`). Fields OpenAI has and the swarm cannot honour are
accepted only at their "off" value (``n: 1``, ``logit_bias: {}``,
``presence_penalty: 0``, ...); any other value, and any field OpenAI does not have, is a
400 naming it in ``param``: a client never gets silence where it asked for something.

Numbers are held to OpenAI's documented ranges before anything else reads them, each
refusal a 400 naming the field: ``seed`` an int64, ``temperature`` 0-2, ``top_p`` 0-1
(0 excluded: the sampler needs some mass), ``n`` 1-128, ``presence_penalty`` and
``frequency_penalty`` -2-2, ``max_tokens`` 1-:data:`~hecate.wire.messages.MAX_TOKENS`,
``top_logprobs`` 0-20. ``stop`` is at most :data:`MAX_STOPS` strings of at most
:data:`~hecate.wire.messages.MAX_STOP_CHARS` characters each: every streamed token is
checked against each of them. A body that is not JSON (nested past what a decoder
recurses through, say) is a 400 like any other.

Two choices that differ from OpenAI's, because the swarm's defaults are better kept:
an omitted ``temperature`` is greedy (0, the swarm's default; OpenAI's is 1), and an
omitted ``max_tokens`` is :data:`DEFAULT_MAX_TOKENS` for chat (OpenAI's is "until the
model stops"; the router needs a bound) and 16 for completions (as OpenAI).

Errors take OpenAI's shape (:mod:`hecate_gateway.apierrors`, re-exported here).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import msgspec

from hecate.wire.messages import (
    MAX_PROMPT_CHARS,
    ChatMessage,
    InferRequest,
)
from hecate.wire.subjects import SLUG
from hecate_gateway import numbers
from hecate_gateway.apierrors import ApiError, Kind, bad, swarm_error, unauthorized
from hecate_gateway.asks import (
    ResponseFormat,
    completion_logprobs,
    logprobs_asked,
    output_format,
)
from hecate_gateway.numbers import (
    COMPLETION_MAX_TOKENS,
    DEFAULT_MAX_TOKENS,
    MAX_SEED,
    MAX_STOPS,
    MIN_SEED,
    RANGES,
)
from hecate_gateway.tools import (
    Choice,
    Tool,
    ToolCall,
    Tooling,
    parse_tools,
    render_call,
    render_response,
)

__all__ = [
    "COMPLETION_MAX_TOKENS",
    "DEFAULT_MAX_TOKENS",
    "MAX_SEED",
    "MAX_STOPS",
    "MIN_SEED",
    "RANGES",
    "TOLERATED",
    "ApiError",
    "ChatBody",
    "CompletionBody",
    "Kind",
    "Prepared",
    "bad",
    "parse",
    "swarm_error",
    "unauthorized",
]


# -- requests ----------------------------------------------------------------------------
class TextPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class Message(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls, in the history
    tool_call_id: str | None = None  # a tool's answer: to which call


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # the client's own switch; nothing to obfuscate


class _Common(msgspec.Struct, kw_only=True):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    user: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None


class ChatBody(_Common, kw_only=True):
    messages: list[Message]
    max_completion_tokens: int | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Choice | None = None
    parallel_tool_calls: bool | None = None  # one call a turn, which either allows


class CompletionBody(_Common, kw_only=True):
    prompt: str | list[str]
    logprobs: int | None = None


def _off(*values: object) -> Callable[[object], bool]:
    return lambda v: v is None or v in values


def _empty(v: object) -> bool:
    return v is None or v == [] or v == {}


# Fields OpenAI has that the swarm cannot honour: allowed only at a value that asks for
# nothing. Known to both endpoints unless named in one of the two sets below.
TOLERATED: Mapping[str, Callable[[object], bool]] = {
    "n": _off(1),
    "functions": _empty,
    "function_call": _off("none", "auto"),
    "logit_bias": _empty,
    "presence_penalty": _off(0),
    "frequency_penalty": _off(0),
    "service_tier": _off("auto", "default"),
    "store": _off(False),
    "metadata": _empty,
    "modalities": lambda v: v is None or v == ["text"],
    "audio": _off(),
    "prediction": _off(),
    "reasoning_effort": _off(),
    "web_search_options": _off(),
    "echo": _off(False),
    "best_of": _off(1),
    "suffix": _off(""),
}
CHAT_ONLY = frozenset(
    {"functions", "function_call", "store", "metadata", "modalities", "audio",
     "prediction", "reasoning_effort", "web_search_options"}
)  # fmt: skip
COMPLETION_ONLY = frozenset({"echo", "best_of", "suffix"})
_FIELDS = {
    "chat": frozenset(ChatBody.__struct_fields__) | (TOLERATED.keys() - COMPLETION_ONLY),
    "completion": frozenset(CompletionBody.__struct_fields__) | (TOLERATED.keys() - CHAT_ONLY),
}
_AT = re.compile(r"`\$\.([A-Za-z_]+)((?:\[\d+\]|\.[A-Za-z_]+)*)`")
_MISSING = re.compile(r"missing required field `([A-Za-z_]+)`")
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass(frozen=True)
class Prepared:
    """A valid request, ready for the swarm (tenant, request id and stream inbox are the
    bridge's to set)."""

    kind: Kind
    model: str
    request: InferRequest
    stream: bool
    include_usage: bool
    stop: tuple[str, ...]
    tooling: Tooling | None = None


def parse(kind: Kind, body: bytes) -> Prepared:
    """Decode and check a ``/v1/chat/completions`` or ``/v1/completions`` body.
    Raises :class:`ApiError` (400, or 404 for a model id no swarm could serve)."""
    try:
        return _parse(kind, body)
    except RecursionError:
        # Nesting deep enough to exhaust the interpreter's stack, wherever it was walked
        # (the decoder, a schema's encoder, the grammar library): the body's fault.
        raise bad("The JSON body of your request is nested too deeply.") from None


def _parse(kind: Kind, body: bytes) -> Prepared:
    try:
        raw = msgspec.json.decode(body)
    except msgspec.DecodeError:
        raise bad("We could not parse the JSON body of your request.") from None
    if not isinstance(raw, dict):
        raise bad("The request body must be a JSON object.")
    for name in raw:
        if name not in _FIELDS[kind]:
            raise bad(f"Unrecognized request argument supplied: {name}", param=str(name))
    for name, (low, high, integer) in RANGES.items():
        if name in raw:
            numbers.in_range(name, raw[name], low, high, integer)
    for name, allowed in TOLERATED.items():
        if name in raw and not allowed(raw[name]):
            raise bad(f"{name}={raw[name]!r} is not supported by this server", param=name)
    target: type[ChatBody | CompletionBody] = ChatBody if kind == "chat" else CompletionBody
    try:
        req = msgspec.convert(raw, target)
    except msgspec.ValidationError as exc:
        raise bad(f"Invalid request: {exc}", param=_param_of(str(exc))) from None
    if not SLUG.fullmatch(req.model):
        raise ApiError(
            404,
            f"The model `{req.model}` does not exist.",
            code="model_not_found",
            param="model",
        )
    if req.stream_options is not None and not req.stream:
        raise bad("stream_options is only allowed when stream is true", param="stream_options")
    tooling = parse_tools(req.tools, req.tool_choice) if isinstance(req, ChatBody) else None
    shape = output_format(req.response_format) if isinstance(req, ChatBody) else None
    if tooling is not None:
        if shape is not None:
            raise bad("response_format cannot be used with tools", param="response_format")
        shape = tooling.shape
    messages, prompt = _input(req)
    stop = numbers.stops(req.stop)
    try:
        request = InferRequest(
            prompt=prompt,
            messages=messages,
            max_tokens=numbers.max_tokens(
                kind, req.max_tokens, getattr(req, "max_completion_tokens", None)
            ),
            temperature=numbers.number("temperature", req.temperature, 0.0, 0.0, 2.0),
            top_p=numbers.top_p(req.top_p),
            seed=numbers.seed(req.seed),
            stop=list(stop),
            output_format=shape,
            tools=tooling.declared if tooling is not None else "",
            logprobs=(
                logprobs_asked(req.logprobs, req.top_logprobs)
                if isinstance(req, ChatBody)
                else completion_logprobs(req.logprobs)
            ),
        )
    except ValueError as exc:
        # The wire's own checks of a field ("tools: ..."): every one this gateway knows
        # of is made above with a better message; one added to the wire since is still
        # the request's fault, not the server's.
        raise bad(f"Invalid request: {exc}", param=_wire_param(str(exc))) from None
    return Prepared(
        kind=kind,
        model=req.model,
        request=request,
        stream=bool(req.stream),
        include_usage=bool(req.stream and req.stream_options and req.stream_options.include_usage),
        stop=stop,
        tooling=tooling,
    )


def _param_of(message: str) -> str | None:
    """The field a msgspec validation message is about, as OpenAI names it:
    ``messages[0].role``."""
    at = _AT.search(message)
    path = at.group(1) + at.group(2) if at else ""
    missing = _MISSING.search(message)
    if missing:
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
    return path or None


def _wire_param(message: str) -> str | None:
    """The field a wire check names first (``tools: nested 40 deep``), if it is one a
    client sends under the same name."""
    name = message.partition(":")[0]
    return name if name in _FIELDS["chat"] | _FIELDS["completion"] else None


def _input(req: ChatBody | CompletionBody) -> tuple[list[ChatMessage] | None, str]:
    """Chat messages go to the swarm as ``messages`` (a chat model renders them with its
    template) and also rendered as plain text in ``prompt``, for a model that reads only
    a prompt (the toy model, an upstream completion endpoint)."""
    if isinstance(req, CompletionBody):
        prompt = req.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise bad("prompt: exactly one prompt per request is supported", param="prompt")
            prompt = prompt[0]
        if len(prompt) > MAX_PROMPT_CHARS:
            raise _too_long("prompt")
        return None, prompt
    if not req.messages:
        raise bad("messages: at least one message is required", param="messages")
    out: list[ChatMessage] = []
    for i, m in enumerate(req.messages):
        out.append(_message(m, i))
    if len(out) > 256:
        raise bad("messages: at most 256 messages", param="messages")
    prompt = "".join(f"{m.role}: {m.content}\n" for m in out) + "assistant:"
    if len(prompt) > MAX_PROMPT_CHARS:
        raise _too_long("messages")
    return out, prompt


def _message(m: Message, i: int) -> ChatMessage:
    """One message as the swarm's chat model reads it: a tool's answer in a user turn,
    an assistant's calls as it writes them (:mod:`hecate_gateway.tools`)."""
    if m.role == "tool":
        return ChatMessage(role="user", content=render_response(_text(m.content, i)))
    role = _ROLES.get(m.role)
    if role is None:
        raise bad(f"messages[{i}].role: {m.role!r} is not supported", f"messages[{i}].role")
    if role == "assistant" and m.tool_calls:
        calls = "\n".join(render_call(c) for c in m.tool_calls)
        text = _text(m.content, i) if m.content else ""
        return ChatMessage(role=role, content=f"{text}{calls}")
    return ChatMessage(role=role, content=_text(m.content, i))


def _text(content: str | list[TextPart] | None, i: int) -> str:
    if content is None:
        raise bad(f"messages[{i}].content is required", param=f"messages[{i}].content")
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if part.type != "text" or part.text is None:
            raise bad(
                f"messages[{i}].content: {part.type!r} parts are not supported (text only)",
                param=f"messages[{i}].content",
            )
        texts.append(part.text)
    return "".join(texts)


def _too_long(param: str) -> ApiError:
    return bad(
        f"{param}: longer than the {MAX_PROMPT_CHARS} characters a request may carry",
        param=param,
        code="context_length_exceeded",
    )
