"""The stage request a dispatch sends, from where the request stands. Pure.

A route's stage is sent as the variant its model's executor takes
(:mod:`hecate.wire.stages`): a layer network's activation (or the prompt, on a first
stage), a generation's step (its session, position, the tokens to feed, the sampling),
or a whole request. The lifecycle decides *which* stage goes and when; this says what
it carries.
"""

from __future__ import annotations

from dataclasses import dataclass

from hecate.core import Route
from hecate.model.executor import ExecutorKind
from hecate.wire.messages import InferRequest
from hecate.wire.stages import LayersStage, StageRequest, StepStage, WholeStage
from hecate_router.generation import Generation


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Stage ``index`` of ``route``, forwarded by the nodes down ``chained`` more stages
    (0 when the router calls each stage itself)."""

    route: Route
    index: int
    chained: int
    model_layers: int
    epoch: int
    reuses: bool = False  # a generation's stages may use and keep cached prompt prefixes
    run_ahead: bool = False  # a chain's first stage may run a long sequence's chunks ahead


def unsupported(request: InferRequest) -> str | None:
    """What ``request`` asks that only a generative model's engine (a ``steps``
    executor, which samples each token) can do, or None."""
    shape = request.output_format
    if shape is not None and shape.type == "lark":
        return "hold its answer to a grammar, as tool calls need (it does not sample)"
    if shape is not None:
        return f"give its answer the shape {shape.type!r} (it does not sample)"
    if request.logprobs is not None:
        return "give log-probabilities (it does not sample)"
    return None


def stage_request(
    kind: ExecutorKind,
    d: Dispatch,
    request: InferRequest,
    request_id: str,
    activation: bytes,
    session: str,
    gen: Generation,
) -> StageRequest:
    """What stage ``d.index`` is sent: ``activation`` is the input of its first layer
    (empty on layer 0, which takes the prompt), ``session`` and ``gen`` a generation's
    state so far."""
    stages = d.route.stages
    stage = stages[d.index]
    first = stage.layer_start == 0
    # The route's end decodes; in a chain every stage carries it down to the end.
    samples = d.index == len(stages) - 1 or d.chained  # it is, or carries down to, the end
    decode = request.max_tokens if samples else None
    chain = stages[d.index + 1 : d.index + 1 + d.chained]
    if kind == "steps":
        # Prefix reuse, scoped to the tenant the bus vouched for (the desk has put it in
        # the request): every stage names the prompt's blocks while it runs, and a later
        # stage's first step takes as many positions from its cache as the first did.
        scope = request.tenant if gen.reuse and d.reuses else None
        tell = scope is not None and gen.prefilling()
        return StepStage(
            request_id=request_id,
            model_id=d.route.model_id,
            layer_start=stage.layer_start,
            layer_end=stage.layer_end,
            model_layers=d.model_layers,
            epoch=d.epoch,
            chain=chain,
            stage_index=d.index,
            session=session,
            position=gen.position,
            step=len(gen.generated),
            prompt=request.prompt if first else "",
            tokens=gen.step_tokens if first else None,
            messages=request.messages if first else None,
            tools=request.tools if first else "",
            activation=activation,
            decode_tokens=decode,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            prompt_tokens=gen.prompt_tokens if tell else None,
            cache_scope=scope,
            reused=gen.reused if not first and gen.position == 0 else 0,
            sampled_from=gen.sampled_from,
            output_format=request.output_format if samples else None,
            sampled=list(gen.generated) if samples and request.output_format else None,
            logprobs=request.logprobs if samples else None,
            run_ahead=d.run_ahead and first and d.chained > 0,
        )
    if kind == "whole":
        return WholeStage(
            request_id=request_id,
            model_id=d.route.model_id,
            layer_start=stage.layer_start,
            layer_end=stage.layer_end,
            model_layers=d.model_layers,
            epoch=d.epoch,
            chain=chain,
            stage_index=d.index,
            prompt=request.prompt,
            decode_tokens=decode,
        )
    return LayersStage(
        request_id=request_id,
        model_id=d.route.model_id,
        layer_start=stage.layer_start,
        layer_end=stage.layer_end,
        model_layers=d.model_layers,
        epoch=d.epoch,
        chain=chain,
        stage_index=d.index,
        prompt=request.prompt if first else "",
        activation=activation,
        decode_tokens=decode,
    )
