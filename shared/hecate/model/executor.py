"""The interface a node uses to execute its share of a model: one of three kinds.

An executor declares its ``kind`` and implements that kind's small protocol; the node
calls it through one path, which converts the wire's stage message into the kind's
typed input and its typed output back into the reply:

* ``layers`` (:class:`LayerExecutor`, the toy and null networks): ``execute`` one
  :class:`LayerInput` (a contiguous range of layers over an opaque activation; the first
  stage embeds the prompt, a last stage may decode text) into a :class:`LayerOutput`.
  Microseconds of work, run on the node's event loop.
* ``steps`` (:class:`StepExecutor`, the real model in ``hecate.llm``): ``execute`` a
  batch of generation steps (:class:`StepInput`, several sessions at once) into one
  :class:`StepOutput` or :class:`ExecutorError` each. It keeps a KV cache per session;
  the node runs its batches on one compute thread.
* ``whole`` (:class:`WholeExecutor`, an upstream HTTP provider): ``complete`` a prompt,
  the whole model in one awaited call.

Activations cross the wire as opaque ``bytes``, so the transport never needs to know
what an executor computes. :func:`kind_of` checks an object against the protocol of
the kind it declares, so a mismatch is refused when the node starts, not at the first
request.

An executor that computes on the node itself also offers ``warm_up`` (:class:`WarmsUp`,
the ``layers`` and ``steps`` kinds require it): one pass of a range on made-up input,
which the node times when it adopts new holdings, so that it announces a latency it
measured instead of carrying the cost model's cold penalty until traffic happens to
reach it. A whole-model executor does not: its pass would be a paid call to a provider.

Executors are looked up by name in :mod:`hecate.executors` (``get_executor``), above
this module and :mod:`hecate.llm` alike, so the real model's package imports nothing
that imports it back. This module imports nothing of hecate but the error codes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Annotated, Literal, Protocol, runtime_checkable

import msgspec

from hecate.core.errors import ErrorCode
from hecate.core.kinds import KINDS as KINDS
from hecate.core.kinds import ExecutorKind as ExecutorKind

_log = logging.getLogger("hecate.model")

#: Upper bound on a model's depth; a range ending past it is rejected as ``bad_range``.
MAX_LAYERS = 4096
#: Upper bound on ``max_tokens`` for ``decode``.
MAX_TOKENS = 4096


class ExecutorError(Exception):
    """An executor refused a request; ``code`` is stable (wire, metrics), ``message`` is for people.

    Codes: ``bad_activation`` (payload of the wrong size or type, or not finite),
    ``bad_range`` (``start < 0``, ``end <= start`` or ``end`` past ``MAX_LAYERS``),
    ``bad_max_tokens`` (``max_tokens`` outside ``0..MAX_TOKENS``),
    ``unknown_executor`` (from the registry, at start: no executor registered under
    that name, or an object that does not implement the kind it declares), and the real
    model's and the upstream's own (``prompt_too_long``, ``session_lost``, ``rate_limited``, ...).
    ``retry_after_s`` is set when the refusal says when to come back.
    """

    def __init__(self, code: ErrorCode, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code: ErrorCode = code
        self.message = message
        self.retry_after_s = retry_after_s

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


# -- layers ------------------------------------------------------------------------------


class LayerInput(msgspec.Struct, frozen=True, kw_only=True):
    """Run layers ``[layer_start, layer_end)`` of ``model_id`` on ``activation``; with an
    empty activation on layer 0, embed ``prompt`` first; with ``decode_tokens`` set (a
    route's last stage), decode that many tokens of text from the result."""

    model_id: str
    layer_start: int
    layer_end: int
    model_layers: int
    activation: bytes = b""
    prompt: str = ""
    decode_tokens: int | None = None


class LayerOutput(msgspec.Struct, frozen=True, kw_only=True):
    """The activation leaving ``layer_end - 1``, or the decoded text instead of it.

    ``prompt_count`` is the prompt's length in the network's tokens, from the stage that
    embedded it; ``completion_count`` the decoded text's, from the stage that decoded
    it. None from a network that does not count (or a stage that did neither)."""

    activation: bytes = b""
    output: str | None = None
    prompt_count: int | None = None
    completion_count: int | None = None


@runtime_checkable
class LayerExecutor(Protocol):
    """Pushes an opaque activation through a range of layers, synchronously."""

    name: str
    kind: Literal["layers"]

    def execute(self, stage: LayerInput) -> LayerOutput:
        """Raises :class:`ExecutorError`."""
        ...

    def warm_up(self, model_id: str, layer_start: int, layer_end: int) -> None: ...


class LayerNetwork:
    """A ``layers`` executor made of three steps, which the toy and null networks
    implement: ``embed`` a prompt into the activation entering layer 0, ``run`` a range,
    ``decode`` the activation leaving the model's last layer into text."""

    name: str
    kind: Literal["layers"] = "layers"

    def embed(self, model_id: str, prompt: str) -> bytes:
        raise NotImplementedError

    def run(self, model_id: str, layer_start: int, layer_end: int, activation: bytes) -> bytes:
        raise NotImplementedError

    def decode(self, model_id: str, layers: int, activation: bytes, max_tokens: int) -> str:
        raise NotImplementedError

    def count(self, model_id: str, text: str) -> int | None:
        """How many of this network's tokens ``text`` is (a prompt it embeds, a text it
        decoded): what a caller is told it read and wrote. None: it does not count."""
        del model_id, text
        return None

    def execute(self, stage: LayerInput) -> LayerOutput:
        x = stage.activation
        prompt_count = None
        if stage.layer_start == 0 and not x:
            x = self.embed(stage.model_id, stage.prompt)
            prompt_count = self.count(stage.model_id, stage.prompt)
        x = self.run(stage.model_id, stage.layer_start, stage.layer_end, x)
        if stage.decode_tokens is None:
            return LayerOutput(activation=x, prompt_count=prompt_count)
        text = self.decode(stage.model_id, stage.model_layers, x, stage.decode_tokens)
        return LayerOutput(
            output=text,
            prompt_count=prompt_count,
            completion_count=self.count(stage.model_id, text),
        )


# -- what the stage that samples is asked, and says of its tokens ----------------------

MAX_SCHEMA_CHARS = 32 * 1024
MAX_TOP_LOGPROBS = 20  # as OpenAI


class OutputFormat(msgspec.Struct, frozen=True, kw_only=True):
    """What a generation's text must be, enforced on the stage that samples (each token
    drawn only among those that keep the text on its way to a valid answer): any JSON
    object (``json_object``), JSON valid against ``schema`` (``json_schema``: the JSON
    Schema, as JSON text), or text of a Lark grammar (``lark``: ``grammar``, which may
    hold JSON Schemas as ``%json {...}``; a tool call or text, say)."""

    type: Literal["json_object", "json_schema", "lark"]
    schema: Annotated[str, msgspec.Meta(max_length=MAX_SCHEMA_CHARS)] = ""
    grammar: Annotated[str, msgspec.Meta(max_length=MAX_SCHEMA_CHARS)] = ""


class Candidate(msgspec.Struct, frozen=True, array_like=True):
    """A token the model weighed at one step: its id, its bytes (part of a character,
    perhaps) and its log-probability under the distribution it was sampled from."""

    token: int
    piece: bytes
    logprob: float


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    """The token sampled at one step, as :class:`Candidate`, with the most likely
    tokens of that step (as many as were asked, most likely first)."""

    token: int
    piece: bytes
    logprob: float
    top: list[Candidate] = []


# -- steps -------------------------------------------------------------------------------


class StepInput(msgspec.Struct, frozen=True, kw_only=True):
    """One generation step of ``session`` on layers ``[layer_start, layer_end)``.

    ``position`` is how many positions the range already holds for the session. The
    first stage takes token ids (``tokens``; ``None``: tokenize ``prompt``, or the chat
    ``messages`` as (role, content) pairs), a later one the ``activation`` its previous
    stage produced; the last samples the next token with ``temperature``, ``top_p`` and
    ``seed``. ``step`` counts the tokens generated before this one and ``decode_tokens``
    is how many the generation may produce (both for the context check)."""

    model_id: str
    layer_start: int
    layer_end: int
    session: str
    position: int = 0
    step: int = 0
    tokens: list[int] | None = None
    prompt: str = ""
    messages: tuple[tuple[str, str], ...] | None = None
    activation: bytes = b""
    decode_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    # Positions from this one on hold sampled tokens (a replay): run one at a time.
    sampled_from: int | None = None
    # The last stage: the text's required shape and the tokens sampled before this
    # step (the constraint's state), and how many likely tokens to report beside the
    # sampled one's log-probability (None: no log-probabilities).
    output_format: OutputFormat | None = None
    sampled: tuple[int, ...] = ()
    logprobs: int | None = None
    # Prefix reuse (StepStage's fields of these names): the tenant's scope, the
    # prompt's tokens, and the positions a later stage's new session takes from cache.
    cache_scope: str | None = None
    prompt_tokens: list[int] | None = None
    reused: int = 0
    tools: str = ""  # the first stage: the functions the model may call (JSON)


class StepOutput(msgspec.Struct, frozen=True, kw_only=True):
    """A step's result: the hidden state for the next stage, or (last stage) the sampled
    token, its text and whether it ends the generation; ``prompt_tokens`` when the
    prompt was tokenized here; ``positions``, how many positions the step ran."""

    activation: bytes = b""
    token: int | None = None
    text: str = ""
    eos: bool = False
    prompt_tokens: list[int] | None = None
    positions: int | None = None
    logprob: TokenLogprob | None = None
    reused: int = 0  # positions taken from a cached prefix (counted in ``positions``)


def own_fault(req: StepInput, part: str, exc: Exception) -> ExecutorError:
    """An exception raised in one request's own part of a batched step: that request's
    error (``bad_request``: no other route would compute it better, so the router
    neither fails it over nor blames the node), logged here in full for the operator,
    since it may as well be a fault in HECATE that this request's data met."""
    why = f"step failed: {part} of session {req.session}"
    _log.log(logging.ERROR, why, exc_info=(type(exc), exc, exc.__traceback__))
    return ExecutorError(
        "bad_request", f"this request's {part} failed: {type(exc).__name__}: {exc}"
    )


@runtime_checkable
class StepExecutor(Protocol):
    """Runs generation steps in batches, keeping a KV cache per session. Every method
    but ``rows``, ``session_count`` and ``limit_payload`` is called on the node's one
    compute thread (or a worker thread, for ``prepare`` and ``tokenize``), never on its
    event loop."""

    name: str
    kind: Literal["steps"]
    #: The most prompt positions a first stage runs in one step.
    prefill_chunk: int

    def execute(self, steps: Sequence[StepInput]) -> list[StepOutput | ExecutorError]:
        """One result per step, in order: a step refused on its own fails only itself;
        anything raised fails the batch."""
        ...

    def rows(self, step: StepInput) -> int | None:
        """Positions ``step`` would run, when known without loading or tokenizing."""
        ...

    def tokenize(self, step: StepInput) -> None:
        """Work out a first step's prompt tokens ahead (on a worker thread, before the
        step waits for a batch), so that ``rows`` knows them; raises
        :class:`ExecutorError` for a prompt refused (its template failed or overran)."""
        ...

    def prepare(self, ranges: list[tuple[int, int]]) -> None:
        """Load the ranges the plan gives the node, drop the others."""
        ...

    def release(self, session: str) -> None:
        """Drop the session's caches."""
        ...

    def session_count(self) -> int: ...

    def limit_payload(self, max_payload: int) -> None:
        """The largest message the bus carries: activations are sized to fit it."""
        ...

    def warm_up(self, model_id: str, layer_start: int, layer_end: int) -> None: ...


# -- whole -------------------------------------------------------------------------------


@runtime_checkable
class WholeExecutor(Protocol):
    """Serves every layer of a model in one call (a stage ``[0, model_layers)``)."""

    name: str
    kind: Literal["whole"]

    async def complete(self, prompt: str, max_tokens: int) -> str:
        """Raises :class:`ExecutorError`, with ``retry_after_s`` when the provider
        said when to come back."""
        ...


Executor = LayerExecutor | StepExecutor | WholeExecutor

#: Each kind's protocol, which :func:`hecate.executors.kind_of` checks an executor against.
PROTOCOLS: dict[ExecutorKind, type] = {
    "layers": LayerExecutor,
    "steps": StepExecutor,
    "whole": WholeExecutor,
}


@runtime_checkable
class WarmsUp(Protocol):
    """An executor that can run one of its ranges without a request."""

    def warm_up(self, model_id: str, layer_start: int, layer_end: int) -> None:
        """Run layers ``[layer_start, layer_end)`` once on a valid made-up input of the
        right shape, as a stage of that range would, and leave no state behind.

        Raises :class:`ExecutorError` (or anything the range's loading raises) if the
        range cannot run here."""
        ...


def check_range(layer_start: int, layer_end: int, max_layers: int = MAX_LAYERS) -> None:
    """Raise ``bad_range`` unless ``0 <= layer_start < layer_end <= max_layers``.

    Shared by executors so every implementation rejects the same ranges the same way.
    """
    if layer_start < 0 or layer_end <= layer_start or layer_end > max_layers:
        raise ExecutorError(
            "bad_range",
            f"layer range [{layer_start}, {layer_end}) is invalid: need "
            f"0 <= start < end <= {max_layers}",
        )
