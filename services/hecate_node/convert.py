"""A node's generation steps between the wire and its executor: a :class:`StepStage`
becomes the executor's :class:`StepInput`, its :class:`StepOutput` the reply. The
executor knows nothing of the wire; this is the one place that converts."""

from __future__ import annotations

from hecate.model.executor import StepInput, StepOutput
from hecate.wire.stages import ActivationReply, StageReply, StepStage, TokenReply


def step_input(req: StepStage) -> StepInput:
    """The executor's typed input for a generation step the wire carries."""
    return StepInput(
        model_id=req.model_id,
        layer_start=req.layer_start,
        layer_end=req.layer_end,
        session=req.session,
        position=req.position,
        step=req.step,
        tokens=req.tokens,
        prompt=req.prompt,
        messages=tuple((m.role, m.content) for m in req.messages) if req.messages else None,
        activation=req.activation,
        decode_tokens=req.decode_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        sampled_from=req.sampled_from,
        output_format=req.output_format,
        sampled=tuple(req.sampled or ()),
        logprobs=req.logprobs,
        cache_scope=req.cache_scope,
        prompt_tokens=req.prompt_tokens,
        reused=req.reused,
        tools=req.tools,
    )


def step_reply(out: StepOutput, prompt_tokens: list[int] | None, *, more: bool) -> StageReply:
    """The wire's reply to a step, from what the executor answered (``more``: a chunk
    of a prompt run ahead, others of it following)."""
    if out.token is None:  # a stage with stages after it
        return ActivationReply(
            activation=out.activation,
            prompt_tokens=prompt_tokens,
            positions=out.positions,
            reused=out.reused,
        )
    return TokenReply(
        token=out.token,
        text=out.text,
        eos=out.eos,
        positions=out.positions,
        prompt_tokens=prompt_tokens,
        logprob=out.logprob,
        more=more,
    )
