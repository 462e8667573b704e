"""How much of a sequence the first stage runs in one step, and whether a sequence fits
the model's context at all (the executor's checks before any computing)."""

from __future__ import annotations

from collections.abc import Sequence

from hecate.llm.gguf_model import LlamaConfig
from hecate.model.executor import ExecutorError, StepInput

#: The most prompt positions the first stage runs in one step (unless the bus is smaller).
PREFILL_CHUNK = 256
#: The share of the bus's max_payload a chunk's activation may fill: the rest is for the
#: request around it (the prompt's token ids down a chain, the route, headers).
PAYLOAD_SHARE = 0.9


def prefill_chunk(hidden: int, max_payload: int | None, limit: int = PREFILL_CHUNK) -> int:
    """Positions per first-stage step: at most ``limit``, and no more than the rows of
    ``hidden`` float32 values that fit :data:`PAYLOAD_SHARE` of ``max_payload``."""
    if max_payload is None:
        return max(1, limit)
    return max(1, min(limit, int(max_payload * PAYLOAD_SHARE) // (4 * hidden)))


def check_context(config: LlamaConfig, req: StepInput, rows: int) -> None:
    """Refuse (``prompt_too_long``) a step that cannot fit the model's context: the
    positions held, the ones this step brings, and, when the request says how many
    tokens the generation may produce (``decode_tokens``), the ones still to come. A
    step of a chunk that is not its prompt's last counts short, never over: the check
    that matters is the one on the prompt's last chunk (or, with the whole prompt in
    hand, the first stage's)."""
    ahead = max(0, (req.decode_tokens or 0) - req.step)
    needed = req.position + rows + ahead
    if needed > config.context:
        prompt = req.position + rows - req.step  # the generated tokens replayed are not
        asks = f" asking for up to {req.decode_tokens:,} tokens" if req.decode_tokens else ""
        raise ExecutorError(
            "prompt_too_long",
            f"a prompt of {prompt:,} tokens{asks} needs {needed:,} positions, over the "
            f"model's context of {config.context:,}",
        )


def chunk_of(req: StepInput, tokens: Sequence[int], size: int, reused: int = 0) -> list[int]:
    """The tokens the first stage runs of ``tokens`` this step, after the ``reused``
    positions a cached prefix holds: at most ``size``, ended where a replay's sampled
    tokens begin (the prompt's last chunk then is the one it first ran)."""
    start = req.position + reused
    if req.sampled_from is not None and start < req.sampled_from:
        size = min(size, req.sampled_from - start)
    return list(tokens[reused : reused + size])
