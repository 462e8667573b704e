"""A generation's token loop, apart from where its steps are sent: what the first stage
is fed each step, what came back, stop strings, and how a replay starts over. Pure.

The router sends a generative model one step at a time: the prompt (or a chunk of a
long one) first, then each sampled token. Its nodes keep per-session caches, so a
rescue route starts empty: a *replay* feeds it the prompt and every token so far in
one message, and the stream carries on where it was. The stages run the prompt as it
first ran and the sampled tokens one position at a time, as decode steps, so that the
rescue route's numbers (and so its greedy tokens) are the first route's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hecate.wire.common import TokenLogprob
from hecate.wire.messages import StreamToken
from hecate.wire.stages import ActivationReply, TokenReply


@dataclass(frozen=True, slots=True)
class Streamed:
    """A token to stream: the ``index``-th generated, its text and log-probability."""

    index: int
    token: int
    text: str
    logprob: TokenLogprob | None

    def message(self, request_id: str) -> StreamToken:
        return StreamToken(
            request_id=request_id,
            index=self.index,
            token=self.token,
            text=self.text,
            logprob=self.logprob,
        )


@dataclass(frozen=True, slots=True)
class Step:
    """What one step's last reply means: ``chunk`` (part of a long sequence ran, no
    token yet), ``next`` (a token; send it) or ``done``; and a token to stream."""

    kind: Literal["chunk", "next", "done"]
    positions: int  # how many positions this step ran
    streamed: Streamed | None = None


@dataclass(slots=True)
class Generation:
    prompt_tokens: list[int] | None = None  # the prompt's ids, once the first stage said
    step_tokens: list[int] | None = None  # what the first stage is fed this step
    position: int = 0  # how many positions the route's caches hold
    generated: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    replays: int = 0
    # On a replay, where the tokens it re-feeds that were sampled begin (the prompt's
    # length): the stages run those one position at a time, as they first ran.
    sampled_from: int | None = None
    finish_reason: Literal["stop", "length"] | None = None
    eos: bool = False  # the model's end token is the last of ``generated``
    # Each text token's log-probability, when asked (the end token is not text).
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # Prefix reuse: whether the stages may start this generation from a cached prefix
    # (off once one of them lost it), and how many positions the first stage took
    # from its cache on this step (the later stages take as many from theirs).
    reuse: bool = True
    reused: int = 0
    first_token_at: float | None = None  # when the first token was heard (the prompt ran)

    @property
    def started(self) -> bool:
        return self.prompt_tokens is not None

    def so_far(self) -> str | None:
        return "".join(self.text) or None

    def completion_tokens(self) -> int:
        """Tokens written: the end token is not text, and not counted."""
        return len(self.generated) - self.eos

    def step(
        self, reply: TokenReply, max_tokens: int, stop: list[str], now: float | None = None
    ) -> Step:
        fed = self.step_tokens if self.step_tokens else (self.prompt_tokens or [])
        steps = len(fed) if reply.positions is None else reply.positions
        self.reused = 0
        self.position += steps
        if 0 < steps < len(fed):
            # A long prompt (or replay) runs a chunk per step, so that its activations
            # fit the bus and other sessions' steps are served in between.
            self.step_tokens = fed[steps:]
            return Step("chunk", steps)
        self.generated.append(reply.token)
        if self.first_token_at is None:
            self.first_token_at = now
        if stop and not reply.eos:
            text = "".join(self.text) + reply.text
            cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
            if cut >= 0:  # a stop string: end here, without it
                self.text = [text[:cut]]
                self.finish_reason = "stop"
                return Step("done", steps)
        streamed = None
        if not reply.eos:
            self.text.append(reply.text)
            if reply.logprob is not None:
                self.logprobs.append(reply.logprob)
            streamed = Streamed(len(self.generated) - 1, reply.token, reply.text, reply.logprob)
        if reply.eos or len(self.generated) >= max_tokens:
            self.eos = reply.eos
            self.finish_reason = "stop" if reply.eos else "length"
            return Step("done", steps, streamed)
        self.step_tokens = [reply.token]
        return Step("next", steps, streamed)

    def heard(self, reply: ActivationReply | TokenReply, *, first: bool) -> bool:
        """What a stage's reply says of the prompt: its tokens (the first stage's
        tokenization), and on the first stage how many positions it took from a cached
        prefix (True when it took some)."""
        if reply.prompt_tokens is not None:
            self.prompt_tokens = reply.prompt_tokens
        if first and isinstance(reply, ActivationReply) and reply.reused:
            self.reused = reply.reused
            return True
        return False

    def prefilling(self) -> bool:
        """Whether the prompt's positions are still being run (its tokens known)."""
        return self.prompt_tokens is not None and self.position < len(self.prompt_tokens)

    def without_prefix(self) -> None:
        """A stage no longer keeps the prefix the first one took: run the step again
        from the start, every position computed."""
        self.reuse = False
        self.reused = 0
        self.position = 0

    def replay(self) -> None:
        """Start over on an empty route: the prompt and every token so far, in one go,
        the sampled tokens marked as such (``sampled_from``)."""
        assert self.prompt_tokens is not None
        self.replays += 1
        self.position = 0
        self.reused = 0
        self.step_tokens = self.prompt_tokens + self.generated
        self.sampled_from = len(self.prompt_tokens)
