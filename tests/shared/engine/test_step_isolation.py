"""One request's own data never fails the batch it shares: a negative seed, a subnormal
temperature, a step whose sampling raises are each that step's business, and the
others in the batch are computed and answered. And the event loop never renders or
tokenizes a prompt: the batching asks what is known, the worker thread works it out."""

from __future__ import annotations

import pytest

from hecate.llm.executor import LlmExecutor
from hecate.llm.store import pull
from hecate.model.executor import ExecutorError, StepInput, StepOutput

pytestmark = pytest.mark.usefixtures("prepared_model")

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def llm() -> LlmExecutor:
    llm = LlmExecutor(path=pull(MODEL, progress=lambda _line: None), threads=1)
    llm.prepare([(0, 30)])
    return llm


def whole(session: str, **kw: object) -> StepInput:
    base: dict[str, object] = {
        "model_id": MODEL,
        "layer_start": 0,
        "layer_end": 30,
        "session": session,
        "decode_tokens": 4,
    }
    return StepInput(**{**base, **kw})  # type: ignore[arg-type]


def test_a_negative_seed_a_subnormal_temperature_and_a_failing_step_fail_no_one_else(
    llm: LlmExecutor,
) -> None:
    prompt = "The capital of France is"
    alone = llm.execute([whole("alone", prompt=prompt)])[0]
    assert isinstance(alone, StepOutput)
    out = llm.execute(
        [
            whole("greedy", prompt=prompt),
            whole("negative-seed", prompt=prompt, temperature=0.7, seed=-1),
            whole("subnormal", prompt=prompt, temperature=1e-310),
            # Past what the wire allows (20): the sampler's own step raises, in its part.
            whole("odd", prompt=prompt, logprobs=10**9),
        ]
    )
    greedy, negative, subnormal, odd = out
    assert isinstance(greedy, StepOutput)
    assert greedy.token == alone.token
    assert isinstance(negative, StepOutput)
    assert negative.token is not None
    # So cold a temperature is greedy in all but name.
    assert isinstance(subnormal, StepOutput)
    assert subnormal.token == alone.token
    assert isinstance(odd, ExecutorError)
    assert odd.code == "bad_request"
    assert "sample" in odd.message


def test_a_negative_seed_samples_as_its_twos_complement(llm: LlmExecutor) -> None:
    prompt = "Once upon a time"
    a, b = llm.execute(
        [
            whole("minus-one", prompt=prompt, temperature=1.5, seed=-1),
            whole("max", prompt=prompt, temperature=1.5, seed=2**64 - 1),
        ]
    )
    assert isinstance(a, StepOutput)
    assert isinstance(b, StepOutput)
    assert a.token == b.token


def test_the_event_loop_only_looks_up_a_prompt_the_worker_tokenized(llm: LlmExecutor) -> None:
    chat = whole("chat", messages=(("user", "x" * 5_000 + " unseen"),))
    assert llm.rows(chat) is None  # not worked out here: the batching does without
    assert llm._prompts.known(chat) is None
    llm.tokenize(chat)
    known = llm._prompts.known(chat)
    assert known is not None
    assert llm.rows(chat) == min(len(known), llm.chunk(576))


def test_a_chat_whose_tools_break_the_template_is_refused_alone(llm: LlmExecutor) -> None:
    broken = whole("tools", messages=(("user", "hi"),), tools="1")
    with pytest.raises(ExecutorError) as refused:
        llm.tokenize(broken)
    assert refused.value.code == "bad_request"
    fine, bad = llm.execute([whole("fine", prompt="Hello"), broken])
    assert isinstance(fine, StepOutput)
    assert isinstance(bad, ExecutorError)
    assert bad.code == "bad_request"
