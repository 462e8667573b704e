"""Tool calls, as OpenAI's chat API asks for them, on a model that only writes text.
Pure: request fields in, the swarm's shape and the rendered conversation out; the
answer's text in, OpenAI's ``tool_calls`` out.

The declared functions go to the first stage, which gives them to the model as its own
chat template does where the template takes tools, else as Qwen2's and Hermes' chat
formats give them (SmolLM2's template has none): a system block listing each function's
JSON signature within ``<tools></tools>`` (:mod:`hecate.llm.template`). A call is written
as ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, and a tool's answer
given back as ``<tool_response>`` in a user turn. The call is never left to the model's
goodwill: the stage that samples holds the answer to a grammar whose calls are JSON
valid against the declared functions (one schema per function: its name as a constant,
its parameters as the arguments), so a call always names a declared function with
arguments its schema accepts.

The tools are checked up front as ``response_format`` is: at most :data:`MAX_TOOLS`
functions named as OpenAI names them, their JSON within what a request carries
(:data:`~hecate.wire.messages.MAX_SCHEMA_CHARS`), and each function's call schema one
the grammar library can follow; any other is a 400 with ``param: "tools"`` naming the
function, before any stage computes a token of the prompt.

``tool_choice``: ``none`` gives the model no tools (a plain answer); ``auto`` (the
default with tools) lets it answer in text or with one call; ``required`` and a named
function make the answer one call (of that function). One call a turn: with
``parallel_tool_calls`` the model may call several, and here it calls one, which the
API allows.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from hecate.llm.constrain import refusal
from hecate.wire.messages import MAX_SCHEMA_CHARS, OutputFormat
from hecate_gateway.apierrors import ApiError, bad

__all__ = [
    "MAX_TOOLS",
    "CallStream",
    "Choice",
    "Mode",
    "Tool",
    "ToolCall",
    "calls_in",
    "parse_tools",
    "render_call",
]

CALL_OPEN, CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"
Mode = Literal["auto", "required"]
MAX_TOOLS = 128  # as OpenAI
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a function's name, as OpenAI allows it


class Function(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # calls are always held to the parameters


class Tool(msgspec.Struct, kw_only=True):
    type: str
    function: Function


class ChoiceFunction(msgspec.Struct, kw_only=True):
    name: str


class NamedChoice(msgspec.Struct, kw_only=True):
    type: str
    function: ChoiceFunction


Choice = str | NamedChoice


class CallFunction(msgspec.Struct, kw_only=True):
    name: str
    arguments: str


class ToolCall(msgspec.Struct, kw_only=True):
    """A call as OpenAI writes it (and a client sends it back in the history)."""

    id: str
    type: str = "function"
    function: CallFunction


@dataclass(frozen=True)
class Tooling:
    """What the tools of a request make of it: the declared functions for the model (JSON,
    as OpenAI's ``tools`` array), the shape the answer is held to, and how to read the
    answer (None: no tools in play)."""

    declared: str
    shape: OutputFormat
    mode: Mode


def parse_tools(tools: list[Tool] | None, choice: Choice | None) -> Tooling | None:
    """Check ``tools`` and ``tool_choice`` (400s naming the part) and make the tooling."""
    if not tools:
        if choice not in (None, "none", "auto"):
            raise bad("tool_choice requires tools", param="tool_choice")
        return None
    if len(tools) > MAX_TOOLS:
        raise bad(f"tools: at most {MAX_TOOLS} functions, got {len(tools)}", param="tools")
    names: list[str] = []
    for i, tool in enumerate(tools):
        if tool.type != "function":
            raise bad(f"tools[{i}].type: {tool.type!r} is not 'function'", f"tools[{i}].type")
        if not _NAME.fullmatch(tool.function.name):
            raise bad(
                f"tools[{i}].function.name: {tool.function.name[:80]!r} is not 1 to 64 "
                "letters, digits, underscores or dashes",
                param=f"tools[{i}].function.name",
            )
        if tool.function.name in names:
            raise bad(f"tools[{i}]: {tool.function.name!r} is declared twice", f"tools[{i}]")
        names.append(tool.function.name)
    declared = _declared(tools)
    if len(declared) > MAX_SCHEMA_CHARS:
        raise _too_big(f"take {len(declared)} characters as JSON")
    for i, tool in enumerate(tools):
        _check_function(i, tool.function)
    if choice == "none":
        return None
    chosen = tools
    mode: Mode = "auto"
    if isinstance(choice, NamedChoice):
        chosen = [t for t in tools if t.function.name == choice.function.name]
        if not chosen:
            raise bad(
                f"tool_choice names {choice.function.name!r}, which is not among the tools",
                param="tool_choice",
            )
        mode = "required"
    elif choice == "required":
        mode = "required"
    elif choice not in (None, "auto"):
        raise bad(
            f"tool_choice: {choice!r} is not one of 'none', 'auto', 'required' or a function",
            param="tool_choice",
        )
    calls: dict[str, Any] = {"anyOf": [_call_schema(t.function) for t in chosen]}
    if mode == "required":
        shape = OutputFormat(type="json_schema", schema=json.dumps(calls))
    else:
        calls["x-guidance"] = {"whitespace_flexible": False}
        # A call inside its tags, or text that does not begin like one.
        grammar = (
            "start: call | text\n"
            f"call: {json.dumps(CALL_OPEN)} body {json.dumps(CALL_CLOSE)}\n"
            f"body: %json {json.dumps(calls)}\n"
            "text: /[^<](.|\\n)*/\n"
        )
        shape = OutputFormat(type="lark", grammar=grammar)
    held = len(shape.schema or shape.grammar)
    if held > MAX_SCHEMA_CHARS:
        raise _too_big(f"make a grammar of {held} characters for the calls")
    if (why := refusal(shape)) is not None:
        # Each function's schema was followed on its own: what is left is the library's
        # own limits on them together, said without the grammar the client never wrote.
        raise bad(f"tools: the functions cannot be followed together: {why[:300]}", "tools")
    return Tooling(declared=declared, shape=shape, mode=mode)


def _too_big(what: str) -> ApiError:
    return bad(
        f"tools: the functions {what}, more than the {MAX_SCHEMA_CHARS} a request may carry",
        param="tools",
    )


def _check_function(i: int, f: Function) -> None:
    """A function whose calls the grammar library can follow (its parameters as a call's
    arguments), as ``response_format``'s schema is checked: else a 400 naming it, not a
    failure on the stage that samples once the whole prompt was computed."""
    schema = json.dumps(_call_schema(f))
    why = refusal(OutputFormat(type="json_schema", schema=schema))
    if why is not None:
        raise bad(
            f"tools[{i}].function.parameters of {f.name!r} is not a JSON Schema this "
            f"server can hold calls to: {why[:300]}",
            param="tools",
        )


def _call_schema(f: Function) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"const": f.name},
            "arguments": f.parameters or {"type": "object"},
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _declared(tools: list[Tool]) -> str:
    """OpenAI's ``tools`` array as JSON, for the first stage to give the model: fields
    the client left out (or null) left out, as the wire's tools have no nulls."""
    return json.dumps(
        [
            {
                "type": "function",
                "function": {
                    k: v for k, v in msgspec.to_builtins(t.function).items() if v is not None
                },
            }
            for t in tools
        ]
    )


def render_call(call: ToolCall) -> str:
    """A call from the history, written as the model writes one."""
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError:
        arguments = call.function.arguments
    body = json.dumps({"name": call.function.name, "arguments": arguments})
    return f"{CALL_OPEN}{body}{CALL_CLOSE}"


def render_response(content: str) -> str:
    return f"<tool_response>\n{content}\n</tool_response>"


#: How a call's JSON begins: the grammar writes its name first, with no whitespace.
_HEAD = re.compile(r'\{"name":("(?:[^"\\]|\\.)*"),"arguments":')


def _body(text: str, mode: Mode) -> str | None:
    """The call's JSON in ``text`` as far as it came (None: not a call)."""
    if mode == "required":
        return text
    if not text.startswith(CALL_OPEN):
        return None
    return text[len(CALL_OPEN) :].removesuffix(CALL_CLOSE)


def calls_in(text: str, mode: Mode, call_id: str) -> list[ToolCall] | None:
    """The calls the answer ``text`` makes (None: it is a plain answer, or a call cut
    short by max_tokens). ``required``: the whole text is one call's JSON; ``auto``: a
    call is within its tags. The arguments are the JSON the model wrote."""
    body = _body(text, mode)
    if body is None:
        return None
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    head = _HEAD.match(body)
    if head is not None:
        arguments = body[head.end() : -1]
    else:  # another order than the grammar's: the arguments as JSON writes them
        arguments = json.dumps(call.get("arguments", {}), separators=(",", ":"))
    return [ToolCall(id=call_id, function=CallFunction(name=call["name"], arguments=arguments))]


class CallStream:
    """A call streamed as its tokens come, as OpenAI streams one: a first delta with the
    call's id and function name once the name is whole, then its arguments a fragment at
    a time (what may be the call's closing brace, and tag, held back until the end)."""

    def __init__(self, mode: Mode, call_id: str) -> None:
        self.mode, self.call_id = mode, call_id
        self.text = ""  # the answer so far, while it is or may become a call
        self.plain = False  # the answer began otherwise than a call: it is text
        self.named = False
        self.sent = 0  # characters of the arguments sent

    def add(self, piece: str) -> list[dict[str, Any]] | None:
        """The deltas ``piece`` lets out of a call, or None: the answer is plain text
        (it began otherwise than a call's tag), to stream as text from here on."""
        if self.plain:
            return None
        self.text += piece
        if self.mode == "auto" and not (
            CALL_OPEN.startswith(self.text) or self.text.startswith(CALL_OPEN)
        ):
            self.plain = True
            return None
        body = _body(self.text, self.mode)
        head = _HEAD.match(body) if body is not None else None
        if body is None or head is None:
            return []
        out: list[dict[str, Any]] = []
        if not self.named:
            self.named = True
            name = json.loads(head.group(1))
            out.append(_delta(id=self.call_id, type="function", name=name, arguments=""))
        held = 1 + (len(CALL_CLOSE) if self.mode == "auto" else 0)
        ready = len(body) - head.end() - held
        if ready > self.sent:
            fragment = body[head.end() + self.sent : head.end() + ready]
            out.append(_delta(arguments=fragment))
            self.sent = ready
        return out

    def finish(self, call: ToolCall) -> list[dict[str, Any]]:
        """What is left of ``call`` (the answer's, read whole) once the answer came."""
        out: list[dict[str, Any]] = []
        if not self.named:
            out.append(_delta(id=call.id, type="function", name=call.function.name, arguments=""))
        rest = call.function.arguments[self.sent :] if self.named else call.function.arguments
        if rest:
            out.append(_delta(arguments=rest))
        return out


def _delta(
    *, arguments: str, id: str | None = None, type: str | None = None, name: str | None = None
) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function = {"name": name, **function}
    delta: dict[str, Any] = {"index": 0}
    if id is not None:
        delta |= {"id": id, "type": type}
    return delta | {"function": function}
