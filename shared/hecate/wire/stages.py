"""Stage traffic between routers and nodes (msgpack): three kinds of request, three
kinds of answer, each a variant of a tagged union whose ``kind`` says which.

What a stage carries depends on what executes the model (:mod:`hecate.model.executor`),
and a router knows that from the plan, so it sends the variant that executor takes:

* ``layers`` (:class:`LayersStage`, the toy and null networks): the activation leaving
  the previous stage, or the prompt on a first stage; a route's end decodes text;
* ``step`` (:class:`StepStage`, a generative model): one generation step of a session,
  with its KV position, the token ids to feed and the sampling settings;
* ``whole`` (:class:`WholeStage`, an upstream provider): the prompt, the whole model in
  one call.

Every variant shares a header (:class:`StageHeader`: which request, which layers of
which model in which plan epoch, and where a chained route goes next). A node answers
an :class:`ActivationReply` (a stage with stages after it), a :class:`TokenReply` (a
generation's last stage) or an :class:`OutputReply` (decoded text), or refuses with the
:class:`~hecate.wire.common.ErrorReply` every subject answers errors with
(``{"ok": false, "error": {...}}``, untagged: the service shell sends it for any
endpoint, before a handler knows what it was sent).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from hecate.core.plan import Stage
from hecate.wire.common import (
    MAX_SCHEMA_CHARS,
    MAX_TOP_LOGPROBS,
    ChatMessage,
    OutputFormat,
    Seed,
    Temperature,
    TokenLogprob,
    TopP,
)

__all__ = [
    "ActivationReply",
    "LayersStage",
    "OutputReply",
    "StageHeader",
    "StageReply",
    "StageRequest",
    "StepStage",
    "TokenReply",
    "WholeStage",
    "reply_decoder",
    "request_decoder",
]


class StageHeader(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """What every stage request says: run layers ``[layer_start, layer_end)`` of
    ``model_id`` (of ``model_layers`` layers) as placed by plan ``epoch``.

    ``chain`` is the rest of the route when nodes forward to each other: the node runs
    its range, then sends the next request itself, with reply subject
    ``{reply_base}-{stage_index + 1}``, so that the router hears the final answer, or
    which stage failed, without touching the stages in between.
    """

    request_id: str
    model_id: str
    layer_start: int
    layer_end: int
    model_layers: int
    epoch: int = 0
    chain: tuple[Stage, ...] = ()
    reply_base: str = ""
    stage_index: int = 0


class LayersStage(StageHeader, frozen=True, kw_only=True, tag="layers"):
    """A layer network's stage: the first embeds ``prompt`` (its ``activation`` is
    empty), later ones take the activation leaving the previous stage; the route's end
    (empty ``chain``) decodes ``decode_tokens`` tokens when it is set."""

    prompt: str = ""
    activation: bytes = b""
    decode_tokens: int | None = None
    # Down a chain: the first stage's count of the prompt (in the network's tokens), so
    # that the last stage's reply carries it back to the router.
    prompt_count: int | None = None


class StepStage(StageHeader, frozen=True, kw_only=True, tag="step"):
    """One generation step of ``session``, whose caches on every stage of the route
    should already hold ``position`` positions. The first stage takes token ids
    (``tokens``; None with a prompt or ``messages``: tokenize them) and may be sent more
    than it runs in one step: it runs the first chunk and says how many in its reply
    (``positions``). Later stages take the activation; the last samples the next token.
    """

    session: str
    position: int = 0
    step: int = 0
    prompt: str = ""
    tokens: list[int] | None = None
    messages: list[ChatMessage] | None = None
    activation: bytes = b""
    decode_tokens: int | None = None
    temperature: Temperature = 0.0
    top_p: TopP = 1.0
    seed: Seed | None = None
    # Down a chain: the first stage's tokenization of the prompt, so that the last
    # stage's reply carries it back to the router (which needs it to replay). With
    # ``cache_scope``, sent to every stage while the prompt runs: each names the
    # cached blocks of the prompt by these tokens.
    prompt_tokens: list[int] | None = None
    # Prefix reuse: the tenant whose cached prompt prefixes this step may use and add
    # to (None: none; set by the router from the identity the bus vouched for, never
    # from the request), and on a later stage's first step how many positions the
    # first stage took from its cache (``ActivationReply.reused``): this stage takes
    # the same from its own, or answers ``prefix_lost``.
    cache_scope: str | None = None
    reused: Annotated[int, msgspec.Meta(ge=0)] = 0
    # The first stage: the functions the model may call (InferRequest.tools, checked at
    # the router's intake; the first stage's template refuses any other shape itself,
    # so every decode step, which carries them again, is not made to walk them).
    tools: Annotated[str, msgspec.Meta(max_length=MAX_SCHEMA_CHARS)] = ""
    # On a replay: positions from this one on hold tokens the generation sampled. Each
    # stage runs them one position at a time, as they ran when they were sampled, and
    # the first stage ends a chunk there: the rescue route computes exactly what the
    # first one did (a prefill's numbers differ from a decode step's).
    sampled_from: int | None = None
    # For the stage that samples, when the text has a required shape: the shape, and
    # the tokens sampled so far (the constraint's state is theirs, whichever node
    # samples: a rescue route's last stage constrains as the first route's did).
    output_format: OutputFormat | None = None
    sampled: list[int] | None = None
    # For the stage that samples: the sampled token's log-probability, with this many
    # of the step's most likely tokens; None: none.
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    # Down a chain, a long sequence's chunks in flight on several stages at once. The
    # router sets ``run_ahead`` on the first stage's step: it runs every chunk of
    # ``tokens`` itself, one a batch, forwarding each as soon as it is run (the next
    # computes while the stages after run this one). ``more`` marks a forwarded chunk
    # that others follow; the last stage's reply to it says so too (TokenReply.more).
    run_ahead: bool = False
    more: bool = False


class WholeStage(StageHeader, frozen=True, kw_only=True, tag="whole"):
    """A whole request for a model computed in one call (an upstream provider): the
    prompt in, at most ``decode_tokens`` tokens of text out."""

    prompt: str
    decode_tokens: int | None = None


StageRequest = LayersStage | StepStage | WholeStage


class _Answer(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    # ``ok`` keeps every stage answer readable as ``{"ok": ..., ...}`` beside the
    # error replies; ``compute_ms`` is what the node spent on it.
    ok: bool = True
    compute_ms: float = 0.0


class ActivationReply(_Answer, frozen=True, kw_only=True, tag="activation"):
    """The activation leaving a stage that has stages after it. A generation's first
    stage also returns the prompt's token ids (for replays) and how many positions it
    ran (``positions``; see :class:`TokenReply`)."""

    activation: bytes
    prompt_tokens: list[int] | None = None
    positions: int | None = None
    # The positions a new session took from a cached prompt prefix (its activation's
    # rows follow them; ``positions`` counts them): the stages after take as many.
    reused: int = 0
    # A layer network's first stage (or a later one on a chain, passing it on): the
    # prompt's length in the network's tokens; None from one that does not count.
    prompt_count: int | None = None


class TokenReply(_Answer, frozen=True, kw_only=True, tag="token"):
    """A generation's last stage sampled ``token`` (``text``; ``eos`` when it ends the
    generation). ``positions`` is how many positions the step ran: the first stage runs
    at most a chunk of a long sequence, and while ``position + positions`` is short of
    it (the prompt, or the prompt and the tokens so far on a replay) the token is not
    the next one and the caller sends ``tokens`` from there on. None from a node that
    ran everything it was sent."""

    token: int
    text: str = ""
    eos: bool = False
    positions: int | None = None
    prompt_tokens: list[int] | None = None
    logprob: TokenLogprob | None = None  # asked for (StepStage.logprobs)
    # A chunk of a sequence the first stage runs ahead (StepStage.run_ahead) with more
    # chunks behind it: their replies follow, on the same send, in order.
    more: bool = False


class OutputReply(_Answer, frozen=True, kw_only=True, tag="output"):
    """Text decoded at a route's end (a layer network's last stage, a whole request).

    ``completion_count`` is the text's length in the model's tokens; ``prompt_count``
    the prompt's, when this stage embedded it or a chain brought it here (on a route
    the router walks, it came in the first stage's :class:`ActivationReply`). None from
    a model that does not count."""

    output: str
    prompt_count: int | None = None
    completion_count: int | None = None


StageReply = ActivationReply | TokenReply | OutputReply


def request_decoder() -> msgspec.msgpack.Decoder[StageRequest]:
    return msgspec.msgpack.Decoder(StageRequest)


def reply_decoder() -> msgspec.msgpack.Decoder[StageReply]:
    return msgspec.msgpack.Decoder(StageReply)
