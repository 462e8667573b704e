"""What one generation step runs on a stage: the rows a request gives it, where its
session starts from a cached prefix, and what the first stage learns of the prompt's
prints for the routers (:mod:`hecate.llm.prefix_news`). Pure but for the prompt's
tokens, which ``prompt_ids`` works out (:class:`hecate.llm.prompts.Prompts`)."""

from __future__ import annotations

from collections.abc import Callable

from hecate.llm.chunks import check_context, chunk_of
from hecate.llm.prefix_news import Announcer
from hecate.llm.prefixes import prefix_of
from hecate.llm.sessions import Sessions, Step
from hecate.model.executor import ExecutorError, StepInput
from hecate.model.prints import text_prints


def step_of(
    sessions: Sessions,
    req: StepInput,
    prompt_ids: Callable[[StepInput], list[int]],
    chunk: Callable[[int], int],
    announcer: Announcer,
) -> tuple[Step, list[int] | None]:
    """What ``req`` runs on ``sessions``' stage, and the prompt's token ids when
    tokenized here. The first stage takes the next chunk of the tokens (``chunk``: the
    most positions a step, by the model's width; a new session's after the longest
    cached prefix of its prompt, with a scope, whose prints ``announcer`` learns); a later
    stage the rows it is sent (after as many positions of its own cached prefix)."""
    stage = sessions.stage
    config = stage.config
    if not stage.first:
        reused = req.reused if req.position == 0 else 0
        rows = len(req.activation) // (4 * config.hidden)
        check_context(config, req, reused + rows)
        sampled = req.sampled_from is not None and req.position + reused >= req.sampled_from
        return Step(
            req.session,
            req.position,
            hidden=req.activation,
            one_by_one=sampled,
            reuse=reused,
            **prefix_of(req.cache_scope, req.prompt_tokens),
        ), None
    prompt_tokens = None
    tokens = req.tokens
    if tokens is None:
        tokens = prompt_tokens = prompt_ids(req)
    if not tokens:
        raise ExecutorError("bad_request", "nothing to generate from: empty prompt")
    check_context(config, req, len(tokens))
    prefix = prefix_of(req.cache_scope, req.prompt_tokens or prompt_tokens)
    reused = 0
    scope = prefix["scope"]
    if req.position == 0 and scope is not None and req.session not in sessions.caches:
        # A new session: start from the longest prefix kept here, leaving at least
        # the last position to compute (its output is the next token's).
        reused = sessions.prefixes.longest(scope, prefix["keys"], len(tokens) - 1)
        prints = text_prints(scope, req.messages, req.prompt)
        announcer.learn(req.model_id, sessions.prefixes, scope, prints, prefix["keys"], len(tokens))
    sampled = req.sampled_from is not None and req.position + reused >= req.sampled_from
    step = Step(
        req.session,
        req.position,
        tokens=chunk_of(req, tokens, chunk(config.hidden), reused),
        one_by_one=sampled,
        reuse=reused,
        **prefix,
    )
    return step, prompt_tokens
