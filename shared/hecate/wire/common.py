"""The shapes the other wire modules share: a typed error, the error reply every
subject answers with, and a chat message (a client's request and a generation's first
stage both carry them). Re-exported by :mod:`hecate.wire.messages`."""

from __future__ import annotations

from typing import Annotated

import msgspec

# What a generation's text must be, and what it says of its own tokens: the types the
# stage that samples works with (the executor's), carried on the wire as they are.
from hecate.model.executor import MAX_SCHEMA_CHARS as MAX_SCHEMA_CHARS
from hecate.model.executor import MAX_TOP_LOGPROBS as MAX_TOP_LOGPROBS
from hecate.model.executor import Candidate as Candidate
from hecate.model.executor import OutputFormat as OutputFormat
from hecate.model.executor import TokenLogprob as TokenLogprob

MAX_PROMPT_CHARS = 64 * 1024
MAX_TOKENS = 4096
# The longest a caller may ask to be held for its quota slot (InferRequest.max_wait_ms).
MAX_WAIT_MS = 600_000
# A sampling seed: any integer OpenAI's API takes (int64), so any msgpack can carry; a
# larger one is refused where it is decoded, not where a router encodes it again.
Seed = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
# Sampling temperature and nucleus mass, as far as the wire goes (callers narrower).
Temperature = Annotated[float, msgspec.Meta(ge=0, le=10)]
TopP = Annotated[float, msgspec.Meta(gt=0, le=1)]
# Each streamed token is checked against every stop string: their length bounds that work.
MAX_STOP_CHARS = 1024
StopString = Annotated[str, msgspec.Meta(max_length=MAX_STOP_CHARS)]


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A typed error: a stable code to act on and a message for a human; an upstream
    that said "slow down" also says for how long (``retry_after_s``)."""

    # One of hecate.wire.errors.ErrorCode when this side sends it, but read as any
    # string: a newer peer may send a code this one does not know (``as_code``).
    code: str
    message: str
    retry_after_s: float | None = None


class ErrorReply(msgspec.Struct, frozen=True, kw_only=True):
    """The shape of every error reply on every subject: ``{"ok": false, "error": {...}}``."""

    ok: bool = False
    error: ErrorBody


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True):
    role: Annotated[str, msgspec.Meta(pattern="^(system|user|assistant)$")]
    content: Annotated[str, msgspec.Meta(max_length=MAX_PROMPT_CHARS)]
