"""What a request asks of its answer beyond text, as OpenAI's API asks it: a shape
(``response_format``) and log-probabilities (``logprobs``, ``top_logprobs``). Pure:
each is checked up front (a 400 naming the part) and turned into what the swarm
enforces (:class:`~hecate.wire.messages.OutputFormat`, ``InferRequest.logprobs``)."""

from __future__ import annotations

import msgspec

from hecate.llm.constrain import refusal
from hecate.wire.messages import MAX_SCHEMA_CHARS, MAX_TOP_LOGPROBS, OutputFormat
from hecate_gateway.apierrors import bad

__all__ = [
    "MAX_COMPLETION_LOGPROBS",
    "JsonSchema",
    "ResponseFormat",
    "completion_logprobs",
    "logprobs_asked",
    "output_format",
]

MAX_COMPLETION_LOGPROBS = 5  # as OpenAI's /v1/completions
SCHEMA = "response_format.json_schema.schema"


class JsonSchema(msgspec.Struct, kw_only=True):
    name: str
    schema: dict[str, object] | None = None
    strict: bool | None = None  # the answer is always held to the schema
    description: str | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    type: str
    json_schema: JsonSchema | None = None


def output_format(fmt: ResponseFormat | None) -> OutputFormat | None:
    """``response_format`` as the swarm enforces it, checked up front."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return OutputFormat(type="json_object")
    if fmt.type != "json_schema":
        raise bad(
            f"response_format.type: {fmt.type!r} is not one of 'text', 'json_object', "
            "'json_schema'",
            param="response_format.type",
        )
    if fmt.json_schema is None or fmt.json_schema.schema is None:
        raise bad(f"{SCHEMA} is required with type 'json_schema'", param=SCHEMA)
    schema = msgspec.json.encode(fmt.json_schema.schema).decode()
    if len(schema) > MAX_SCHEMA_CHARS:
        raise bad(f"{SCHEMA}: longer than {MAX_SCHEMA_CHARS} characters", param=SCHEMA)
    shape = OutputFormat(type="json_schema", schema=schema)
    why = refusal(shape)
    if why is not None:
        raise bad(f"{SCHEMA} cannot be followed: {why}", param=SCHEMA)
    return shape


def logprobs_asked(logprobs: bool | None, top: int | None) -> int | None:
    """Chat's ``logprobs`` and ``top_logprobs``: how many likely tokens to report beside
    each token's log-probability; None: no log-probabilities."""
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise bad(
            f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {top}",
            param="top_logprobs",
        )
    if not logprobs:
        if top:
            raise bad("top_logprobs requires logprobs to be true", param="top_logprobs")
        return None
    return top or 0


def completion_logprobs(logprobs: int | None) -> int | None:
    """A completion's ``logprobs``: the likely tokens to report beside each token's."""
    if logprobs is not None and not 0 <= logprobs <= MAX_COMPLETION_LOGPROBS:
        raise bad(
            f"logprobs must be between 0 and {MAX_COMPLETION_LOGPROBS}, got {logprobs}",
            param="logprobs",
        )
    return logprobs
