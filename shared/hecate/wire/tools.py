"""The functions a model may call (OpenAI's ``tools`` array), as the wire carries them:
JSON text, checked where a message carrying it is decoded.

The text reaches a chat template on the first stage, which walks it: a value that is
not an array of function objects (``"1"``, ``"null"``), or one nested so deep that
walking it recurses past the interpreter's limit, would fail there, on a node, as the
node's fault. :func:`tools_problem` says what is wrong with it instead, so the message
that carries it is refused at its decode, before any node sees it.
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Annotated, Any, Literal

import msgspec

__all__ = ["MAX_TOOLS", "MAX_TOOL_DEPTH", "Tool", "tools_problem"]

MAX_TOOLS = 128
# Brackets deep, counting the array itself: a function's parameter schema nests a few
# levels per object parameter; recursion (json, Jinja's tojson) fails near 1,000.
MAX_TOOL_DEPTH = 32


class ToolFunction(msgspec.Struct, frozen=True, kw_only=True):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    description: str = ""
    parameters: dict[str, Any] | None = None


class Tool(msgspec.Struct, frozen=True, kw_only=True):
    type: Literal["function"]
    function: ToolFunction


_tools = msgspec.json.Decoder(Annotated[list[Tool], msgspec.Meta(max_length=MAX_TOOLS)])


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def depth(text: str) -> int:
    """How many brackets deep ``text`` (JSON) nests, strings left out; without
    decoding it, so a value of any depth is measured without recursion."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(1 if b in "[{" else -1 for b in brackets), default=0)


def tools_problem(text: str) -> str | None:
    """What makes ``text`` no tools array (None: it is one, or empty: no tools)."""
    if not text:
        return None
    if (deep := depth(text)) > MAX_TOOL_DEPTH:
        return f"tools: nested {deep} deep, over {MAX_TOOL_DEPTH}"
    try:
        _tools.decode(text)
    except (msgspec.DecodeError, RecursionError) as exc:
        return f"tools: not an array of function objects ({exc})"
    return None
