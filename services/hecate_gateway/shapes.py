"""What an OpenAI client reads: response bodies and the SSE frames of a streamed answer,
built from the swarm's reply. Pure: ids and ``created`` are passed in.

Streaming follows OpenAI to the byte: every chunk has the same ``id`` and ``created``;
a chat stream's first chunk carries the role (and ``content: ""``), later ones only
content; a content-less chunk with ``delta: {}`` (chat) or ``text: ""`` (completions)
carries ``finish_reason``; with ``stream_options.include_usage`` every chunk has
``usage: null`` and a last one has ``choices: []`` and the usage; then ``data: [DONE]``.

HTTP headers leave before the route is known, so a streamed answer says whether it was
degraded, and which nodes served it, in an extension field of its finishing chunk:
``"hecate": {"degraded": true, "route": "gpu,laptop"}`` (pydantic-based clients keep
unknown fields: ``chunk.model_extra["hecate"]``). Non-streamed answers say it in the
``x-hecate-degraded`` and ``x-hecate-route`` headers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from hecate.wire.messages import InferReply, TokenLogprob
from hecate_gateway.openai import ApiError, Kind
from hecate_gateway.tools import ToolCall, Tooling, calls_in

DONE = b"data: [DONE]\n\n"
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True)
class Answer:
    """A finished generation as OpenAI accounts for it."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list[ToolCall] | None = None  # the answer is calls, not text

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` up to the first stop string, and whether one was found. The router cuts a
    generative model's text itself; a model that answers in one piece (the toy model)
    is cut here, so ``stop`` means the same on every model."""
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


def answer_of(
    reply: InferReply,
    stop: tuple[str, ...],
    streamed: int = 0,
    tooling: Tooling | None = None,
    call_id: str = "",
) -> Answer:
    """The answer in ``reply`` (ok). Counts a model did not report are 0, except the
    completion tokens of a streamed answer, which are the tokens that came. With tools
    in play, an answer that is a call is given as ``tool_calls`` (``call_id`` names it)."""
    text, cut = cut_at_stop(reply.output or "", stop)
    completion = reply.completion_tokens
    calls = calls_in(text, tooling.mode, call_id) if tooling is not None else None
    finish = "stop" if cut else (reply.finish_reason or "stop")
    return Answer(
        text="" if calls else text,
        finish_reason="tool_calls" if calls else finish,
        prompt_tokens=reply.prompt_tokens or 0,
        completion_tokens=streamed if completion is None else completion,
        logprobs=reply.logprobs,
        tool_calls=calls,
    )


def _token(piece: bytes) -> str:
    """A token's text as OpenAI shows it: its bytes, escaped where they are part of a
    character (the exact bytes go beside it in ``bytes``)."""
    return piece.decode("utf-8", errors="backslashreplace")


def logprobs_of(
    kind: Kind, entries: Sequence[TokenLogprob] | None, offset: int = 0
) -> dict[str, Any] | None:
    """OpenAI's ``logprobs`` of a choice: chat's ``content`` list (each token with its
    ``top_logprobs``), or a completion's parallel lists (``text_offset`` counted from
    ``offset``, the completion's characters before these tokens)."""
    if entries is None:
        return None
    if kind == "chat":
        return {
            "content": [
                {
                    "token": _token(e.piece),
                    "logprob": e.logprob,
                    "bytes": list(e.piece),
                    "top_logprobs": [
                        {"token": _token(c.piece), "logprob": c.logprob, "bytes": list(c.piece)}
                        for c in e.top
                    ],
                }
                for e in entries
            ],
            "refusal": None,
        }
    tokens = [_token(e.piece) for e in entries]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{_token(c.piece): c.logprob for c in e.top} for e in entries],
        "text_offset": offsets,
    }


def response_id(kind: Kind, request_id: str) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{request_id}"


def body(kind: Kind, rid: str, created: int, model: str, answer: Answer) -> bytes:
    """A whole (non-streamed) response."""
    if kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": _message(answer),
            "logprobs": logprobs_of(kind, answer.logprobs),
            "finish_reason": answer.finish_reason,
        }
        obj = "chat.completion"
    else:
        choice = {
            "text": answer.text,
            "index": 0,
            "logprobs": logprobs_of(kind, answer.logprobs),
            "finish_reason": answer.finish_reason,
        }
        obj = "text_completion"
    return _encode(
        {
            "id": rid,
            "object": obj,
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": answer.usage(),
        }
    )


def _message(answer: Answer) -> dict[str, Any]:
    if answer.tool_calls:
        calls = [msgspec.to_builtins(c) for c in answer.tool_calls]
        return {"role": "assistant", "content": None, "refusal": None, "tool_calls": calls}
    return {"role": "assistant", "content": answer.text, "refusal": None}


def error_body(error: ApiError) -> bytes:
    return _encode(error.body())


class Frames:
    """The SSE frames of one streamed answer."""

    def __init__(self, kind: Kind, rid: str, created: int, model: str, include_usage: bool):
        self.kind = kind
        self.include_usage = include_usage
        self._offset = 0  # the completion's characters sent, for its text offsets
        self._head: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
            "created": created,
            "model": model,
        }

    def _frame(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk = {**self._head, "choices": choices, **extra}
        if self.include_usage and "usage" not in chunk:
            chunk["usage"] = None
        return b"data: " + _encode(chunk) + b"\n\n"

    def _choice(
        self,
        content: dict[str, Any] | str,
        finish: str | None,
        logprobs: Sequence[TokenLogprob] | None = None,
    ) -> dict[str, Any]:
        said = logprobs_of(self.kind, logprobs, self._offset) if logprobs else None
        if self.kind == "chat":
            return {"index": 0, "delta": content, "logprobs": said, "finish_reason": finish}
        return {"text": content, "index": 0, "logprobs": said, "finish_reason": finish}

    def start(self) -> bytes:
        """The first frame: a chat stream announces the role; a completion has none."""
        if self.kind != "chat":
            return b""
        return self._frame([self._choice({"role": "assistant", "content": ""}, None)])

    def delta(self, text: str, logprobs: Sequence[TokenLogprob] = ()) -> bytes:
        """A frame of ``text``, with the log-probabilities of the tokens it completes."""
        if not text:
            return b""
        content = {"content": text} if self.kind == "chat" else text
        frame = self._frame([self._choice(content, None, logprobs)])
        self._offset += len(text)
        return frame

    def calls(self, deltas: list[dict[str, Any]], logprobs: Sequence[TokenLogprob] = ()) -> bytes:
        """A chat frame of tool-call deltas (:class:`~hecate_gateway.tools.CallStream`)."""
        if not deltas:
            return b""
        return self._frame([self._choice({"tool_calls": deltas}, None, logprobs)])

    def end(
        self, answer: Answer, degraded: bool, route: str, logprobs: Sequence[TokenLogprob] = ()
    ) -> bytes:
        """The finishing frame (with the log-probabilities of tokens no text frame
        carried, an end of text held back), then the usage frame when asked for."""
        empty: dict[str, Any] | str = {} if self.kind == "chat" else ""
        out = self._frame(
            [self._choice(empty, answer.finish_reason, logprobs)],
            hecate={"degraded": degraded, "route": route},
        )
        if self.include_usage:
            out += self._frame([], usage=answer.usage())
        return out + DONE

    @staticmethod
    def error(error: ApiError) -> bytes:
        """A failure after the stream began: OpenAI's clients raise an ``APIError`` on a
        ``data:`` event carrying ``error``. No ``[DONE]`` follows it."""
        return b"data: " + error_body(error) + b"\n\n"


class StopTail:
    """How much of a text's end could begin the stop string ``stop``: the longest suffix
    that is a proper prefix of it, followed as the text grows (Knuth-Morris-Pratt). A
    piece costs work in its own length, and never more than the stop string's: trying
    each prefix of each stop string at each token costs the square of their length, on
    the event loop, every token. ``steps`` counts the characters and fall-backs walked."""

    def __init__(self, stop: str) -> None:
        self.stop = stop
        self.state = 0  # the longest suffix that is a prefix of stop (stop itself, at most)
        self.steps = 0
        # border[i]: the longest proper prefix of stop[: i + 1] that is also its suffix.
        self.border = [0] * len(stop)
        k = 0
        for i in range(1, len(stop)):
            while k and stop[i] != stop[k]:
                k = self.border[k - 1]
            if stop[i] == stop[k]:
                k += 1
            self.border[i] = k

    def feed(self, piece: str) -> int:
        """The held-back length once ``piece`` is added to the text."""
        stop, border, m = self.stop, self.border, len(self.stop)
        if not m:
            return 0
        q = self.state
        if len(piece) >= m:  # nothing before the last m characters can begin a match
            q, piece = 0, piece[-m:]
        steps = 0
        for c in piece:
            while q and (q == m or stop[q] != c):
                q = border[q - 1]
                steps += 1
            if stop[q] == c:
                q += 1
        self.state = q
        self.steps += steps + len(piece)
        # A whole stop string at the end: only a shorter start of the next one can wait.
        return q if q < m else border[m - 1]


class StreamText:
    """Streams a generation's text without ever sending what the final answer drops.

    The router never streams a token that completes a stop string, but text already
    streamed may end with the start of one (``"\\n"`` of ``"\\n\\n"``), which the answer
    then cuts. So the longest tail of the text that could begin a stop string is held
    back until more text shows it was not one, or the final answer comes."""

    def __init__(self, stop: tuple[str, ...]) -> None:
        self.stop = stop
        self.text = ""
        self.sent = 0
        self.tails = [StopTail(s) for s in stop if s]

    def add(self, piece: str) -> str:
        """What may be sent now that ``piece`` came."""
        self.text += piece
        held = max((tail.feed(piece) for tail in self.tails), default=0)
        end = len(self.text) - held
        out = self.text[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return out

    def finish(self, output: str) -> str:
        """The rest of the final ``output`` (nothing if it does not extend what was sent:
        sent text cannot be taken back)."""
        if not output.startswith(self.text[: self.sent]):
            return ""
        rest = output[self.sent :]
        self.text, self.sent = output, len(output)
        for tail in self.tails:
            tail.state = 0
            tail.feed(output)
        return rest
