"""Batched steps of the numpy llama on small random weights (no model file, no I/O):
a batch gives each session what it would get alone, whatever else shares it; a lost
session fails only its own step; prefill chunks fit the bus; a prompt that cannot fit
the context is refused for that."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hecate.llm.chunks import PAYLOAD_SHARE, check_context, prefill_chunk
from hecate.llm.executor import LlmExecutor
from hecate.llm.gguf_model import Block, LlamaConfig, StageWeights
from hecate.llm.llama import Array, LlamaStage
from hecate.llm.sessions import (
    FULL_CONTEXT_SESSIONS,
    Sessions,
    Step,
    kv_bytes_per_position,
    kv_itemsize,
)
from hecate.model.executor import ExecutorError, StepInput, StepOutput

CONFIG = LlamaConfig(
    layers=3,
    hidden=48,
    heads=6,
    kv_heads=2,
    head_dim=8,
    ffn=96,
    eps=1e-5,
    rope_base=10000.0,
    vocab=97,
    context=512,
)


def weights(start: int, end: int, seed: int = 0) -> StageWeights:
    """Random blocks ``[start, end)`` of one model (the same ``seed``, the same model)."""
    c = CONFIG
    rng = np.random.default_rng(seed)

    def m(*shape: int, scale: float = 0.15) -> Array:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    qkv = (c.heads + 2 * c.kv_heads) * c.head_dim
    blocks = [
        Block(
            attn_norm=1 + m(c.hidden, scale=0.1),
            wqkv=m(c.hidden, qkv),
            wo=m(c.hidden, c.hidden),
            ffn_norm=1 + m(c.hidden, scale=0.1),
            w_gate_up=m(c.hidden, 2 * c.ffn),
            w_down=m(c.ffn, c.hidden),
        )
        for _ in range(c.layers)
    ]
    embedding = m(c.vocab, c.hidden, scale=1.0)
    output_norm = 1 + m(c.hidden, scale=0.1)
    return StageWeights(
        c,
        start,
        end,
        blocks[start:end],
        embedding if start == 0 else None,
        output_norm if end == c.layers else None,
        embedding if end == c.layers else None,  # tied
    )


WHOLE = LlamaStage(weights(0, CONFIG.layers))


def alone(stage: LlamaStage, steps: list[list[int]]) -> list[Array]:
    """One session's logits after each of its steps, run by itself."""
    cache = stage.new_cache()
    return [stage.logits(stage.forward(stage.embed(t), cache)) for t in steps]


def tokens(rng: np.random.Generator, n: int) -> list[int]:
    return [int(t) for t in rng.integers(0, CONFIG.vocab, n)]


@settings(max_examples=25, deadline=None)
@given(
    prompts=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    decode=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_a_batch_gives_each_session_what_it_gets_alone(
    prompts: list[int], decode: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    # Each session: its prompt in one step, then single-token decode steps; in the
    # batch they all step together (prefills of different lengths, then decodes).
    steps = [[tokens(rng, n)] + [tokens(rng, 1) for _ in range(decode)] for n in prompts]
    expected = [alone(WHOLE, s) for s in steps]
    caches = [WHOLE.new_cache() for _ in steps]
    for k in range(decode + 1):
        outs = WHOLE.forward_batch([WHOLE.embed(s[k]) for s in steps], caches)
        logits = WHOLE.logits_batch(outs)
        for j, s in enumerate(steps):
            assert outs[j].shape == (len(s[k]), CONFIG.hidden)
            np.testing.assert_allclose(logits[j], expected[j][k], rtol=1e-4, atol=1e-4)
            assert int(np.argmax(logits[j])) == int(np.argmax(expected[j][k]))
    assert [c.length for c in caches] == [n + decode for n in prompts]


def test_a_prefill_chunk_and_decode_steps_share_a_batch() -> None:
    rng = np.random.default_rng(1)
    prompt = tokens(rng, 60)
    decoding = [tokens(rng, 9), tokens(rng, 23)]
    # Alone: the long prompt in chunks of 16 (as a first stage runs it), then one token.
    chunks = [prompt[i : i + 16] for i in range(0, 60, 16)]
    expected_long = alone(WHOLE, [*chunks, [5]])
    expected_short = [alone(WHOLE, [d, [3], [4], [7], [8]]) for d in decoding]
    caches = [WHOLE.new_cache() for _ in range(3)]
    first = WHOLE.forward_batch(
        [WHOLE.embed(d) for d in decoding], caches[1:]
    )  # the short prompts start before the long one arrives
    for j, out in enumerate(first):
        np.testing.assert_allclose(WHOLE.logits(out), expected_short[j][0], atol=1e-4)
    # The long prompt's chunks join the two sessions' decode steps, one chunk a batch.
    for k, (chunk, nxt) in enumerate(zip([*chunks, [5]], [3, 4, 7, 8, 9], strict=False)):
        outs = WHOLE.forward_batch(
            [WHOLE.embed(chunk), WHOLE.embed([nxt]), WHOLE.embed([nxt])], caches
        )
        logits = WHOLE.logits_batch(outs)
        np.testing.assert_allclose(logits[0], expected_long[k], rtol=1e-4, atol=1e-4)
        if k < 4:
            for j in (1, 2):
                np.testing.assert_allclose(
                    logits[j], expected_short[j - 1][k + 1], rtol=1e-4, atol=1e-4
                )
    assert caches[0].length == 61


def test_chunks_give_the_same_next_token_as_one_prefill() -> None:
    rng = np.random.default_rng(2)
    prompt = tokens(rng, 200)
    whole = WHOLE.logits(WHOLE.forward(WHOLE.embed(prompt), WHOLE.new_cache()))
    cache = WHOLE.new_cache()
    for i in range(0, 200, 48):
        hidden = WHOLE.forward(WHOLE.embed(prompt[i : i + 48]), cache)
    np.testing.assert_allclose(WHOLE.logits(hidden), whole, rtol=1e-4, atol=1e-4)
    assert int(np.argmax(WHOLE.logits(hidden))) == int(np.argmax(whole))


def test_stages_in_a_chain_batch_like_the_whole_model() -> None:
    stages = [LlamaStage(weights(a, b)) for a, b in ((0, 1), (1, 3))]
    rng = np.random.default_rng(3)
    prompts = [tokens(rng, 7), tokens(rng, 1), tokens(rng, 30)]
    sessions = [Sessions(s) for s in stages]
    first = sessions[0].step_batch([Step(f"s{j}", 0, tokens=p) for j, p in enumerate(prompts)])
    assert all(isinstance(h, np.ndarray) for h in first)
    last = sessions[1].step_batch(
        [
            Step(f"s{j}", 0, hidden=np.asarray(h).astype("<f4").tobytes())
            for j, h in enumerate(first)
        ]
    )
    logits = stages[1].logits_batch([np.asarray(h) for h in last])
    for j, p in enumerate(prompts):
        np.testing.assert_allclose(logits[j], alone(WHOLE, [p])[0], rtol=1e-4, atol=1e-4)


def test_a_lost_session_fails_only_its_own_step() -> None:
    sessions = Sessions(WHOLE)
    assert not isinstance(sessions.step_batch([Step("a", 0, tokens=[1, 2, 3])])[0], Exception)
    assert not isinstance(sessions.step_batch([Step("b", 0, tokens=[4, 5])])[0], Exception)
    out = sessions.step_batch(
        [
            Step("a", 3, tokens=[6]),  # right where it is
            Step("b", 7, tokens=[6]),  # a position this node never held
            Step("c", 4, tokens=[6]),  # a session this node never saw
            Step("d", 0, tokens=[500]),  # a token outside the vocabulary
            Step("e", 0, tokens=[8, 9]),  # a new session
        ]
    )
    assert isinstance(out[0], np.ndarray)
    assert out[0].shape == (1, CONFIG.hidden)
    assert isinstance(out[1], ExecutorError)
    assert out[1].code == "session_lost"
    assert isinstance(out[2], ExecutorError)
    assert out[2].code == "session_lost"
    assert isinstance(out[3], ExecutorError)
    assert out[3].code == "bad_request"
    assert isinstance(out[4], np.ndarray)
    assert out[4].shape == (2, CONFIG.hidden)
    assert sessions.caches["a"][0].length == 4
    assert "b" not in sessions.caches  # a lost session's cache is dropped: it replays
    assert sessions.caches["e"][0].length == 2


def test_a_session_named_twice_in_a_batch_steps_in_order() -> None:
    sessions = Sessions(WHOLE)
    out = sessions.step_batch([Step("a", 0, tokens=[1, 2]), Step("a", 2, tokens=[3])])
    assert all(isinstance(o, np.ndarray) for o in out)
    expected = alone(WHOLE, [[1, 2], [3]])[1]
    np.testing.assert_allclose(WHOLE.logits(np.asarray(out[1])), expected, rtol=1e-4, atol=1e-4)


def test_a_malformed_activation_is_refused_alone() -> None:
    stage = LlamaStage(weights(1, 3))
    sessions = Sessions(stage)
    good = np.ones((2, CONFIG.hidden), dtype="<f4").tobytes()
    out = sessions.step_batch([Step("a", 0, hidden=good), Step("b", 0, hidden=good[:-4])])
    assert isinstance(out[0], np.ndarray)
    assert isinstance(out[1], ExecutorError)
    assert out[1].code == "bad_activation"


def test_caches_have_room_for_a_few_full_context_sessions() -> None:
    stage = LlamaStage(weights(1, 3))
    assert kv_itemsize(stage) == 4  # the numpy model keeps float32
    per_position = kv_bytes_per_position(CONFIG, 2, kv_itemsize(stage))
    assert per_position == 2 * 2 * CONFIG.kv_heads * CONFIG.head_dim * 4
    assert Sessions(stage).max_bytes == FULL_CONTEXT_SESSIONS * CONFIG.context * per_position
    # A cache grows to the context at most, not to the next power of two past it.
    cache = stage.new_cache()
    cache.reserve(CONFIG.context - 10, limit=CONFIG.context)
    assert cache.k.shape[2] == CONFIG.context


@pytest.mark.parametrize(
    ("hidden", "max_payload", "limit", "chunk"),
    [
        (576, 1024 * 1024, 256, 256),  # SmolLM2 on NATS' default bus: the limit
        (576, 1024 * 1024, 4096, 409),  # ... or the rows within 0.9 of 1 MB
        (576, 256 * 1024, 256, 102),  # a smaller bus: what fits
        (4096, 64 * 1024, 256, 3),
        (8192, 1024, 256, 1),  # never nothing: one position at least
        (576, None, 256, 256),  # not connected yet
    ],
)
def test_a_prefill_chunk_fits_the_bus(
    hidden: int, max_payload: int | None, limit: int, chunk: int
) -> None:
    assert prefill_chunk(hidden, max_payload, limit) == chunk
    if max_payload is not None and chunk > 1:
        assert chunk * hidden * 4 <= max_payload * PAYLOAD_SHARE


def request(**fields: object) -> StepInput:
    base: dict[str, object] = {
        "model_id": "m",
        "layer_start": 0,
        "layer_end": CONFIG.layers,
        "session": "s",
    }
    return StepInput(**(base | fields))  # type: ignore[arg-type]


def test_a_prompt_that_cannot_fit_the_context_is_prompt_too_long() -> None:
    context = CONFIG.context
    check_context(CONFIG, request(tokens=[1] * (context - 16), decode_tokens=16), context - 16)
    with pytest.raises(ExecutorError) as refused:
        check_context(CONFIG, request(decode_tokens=17), context - 16)
    assert refused.value.code == "prompt_too_long"
    assert f"{context - 16:,} tokens" in refused.value.message
    assert f"context of {context:,}" in refused.value.message
    # A decode step of that generation (its 6th token in): held, sent and still due.
    check_context(CONFIG, request(position=context - 16 + 5, step=6, decode_tokens=16), 1)
    # A replay (prompt and 6 generated tokens again) is judged by the same total.
    check_context(CONFIG, request(step=6, decode_tokens=16), context - 10)
    with pytest.raises(ExecutorError):
        check_context(CONFIG, request(step=6, decode_tokens=16), context - 9)
    # Without decode_tokens (a first stage routed hop by hop) only what is held counts.
    check_context(CONFIG, request(), context)
    with pytest.raises(ExecutorError):
        check_context(CONFIG, request(position=context), 1)


class Small(LlmExecutor):
    """The generative executor over the random model: ranges built, never loaded, and a
    tokenizer that is a byte per token."""

    def __init__(self, chunk: int) -> None:
        super().__init__(prefill_chunk=chunk)
        for a, b in ((0, 1), (1, 3), (0, 3)):
            self._ranges[(a, b)] = Sessions(LlamaStage(weights(a, b)))

    def prepare(self, ranges: list[tuple[int, int]]) -> None:
        missing = [r for r in ranges if r not in self._ranges]
        if missing:  # what loading a range outside the model says
            raise ValueError(f"layer range {missing[0]} outside 0..{CONFIG.layers}")

    def tokenizer(self):  # type: ignore[no-untyped-def]
        return ByteTokenizer()


class ByteTokenizer:
    class Encoding:
        def __init__(self, ids: list[int]) -> None:
            self.ids = ids

    def encode(self, text: str) -> ByteTokenizer.Encoding:
        return ByteTokenizer.Encoding([b % CONFIG.vocab for b in text.encode()])

    def encode_batch(self, texts: list[str]) -> list[ByteTokenizer.Encoding]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(32 + i) for i in ids)


def test_the_first_stage_runs_a_chunk_and_says_how_many() -> None:
    llm = Small(chunk=16)
    prompt = "a prompt of forty bytes, more than a chunk"
    ids = ByteTokenizer().encode(prompt).ids
    reply = llm.step(request(layer_end=1, prompt=prompt))
    assert reply.positions == 16
    assert reply.prompt_tokens == ids  # the whole prompt, for the caller to carry on
    assert len(reply.activation) == 16 * CONFIG.hidden * 4
    # The caller sends the rest from where the stage got to; again a chunk at most.
    nxt = llm.step(request(layer_end=1, position=16, tokens=ids[16:]))
    assert nxt.positions == 16
    assert nxt.prompt_tokens is None
    end = llm.step(request(layer_end=1, position=32, tokens=ids[32:]))
    assert end.positions == len(ids) - 32
    # The next stage runs the rows it was sent and says so.
    last = llm.step(request(layer_start=1, position=0, activation=reply.activation))
    assert last.positions == 16
    assert last.token is not None


def test_chunked_steps_reach_the_token_of_one_step() -> None:
    prompt = "the same prompt, run in chunks or at once: one next token"
    chunked, once = Small(chunk=8), Small(chunk=256)
    reply = once.step(request(prompt=prompt, decode_tokens=4))
    ids = reply.prompt_tokens
    assert ids is not None
    assert reply.positions == len(ids)
    position, step = 0, chunked.step(request(prompt=prompt, decode_tokens=4))
    while position + (step.positions or 0) < len(ids):
        position += step.positions or 0
        step = chunked.step(request(position=position, tokens=ids[position:], decode_tokens=4))
    assert step.token == reply.token


def test_a_batch_answers_each_request_on_its_own() -> None:
    llm = Small(chunk=64)
    context = CONFIG.context
    replies = llm.execute(
        [
            request(session="a", prompt="hello"),
            request(session="b", tokens=[1] * (context - 3), decode_tokens=8),
            request(session="c", position=5, tokens=[1]),  # never started here
            request(session="d", prompt=""),
            request(session="e", layer_start=1, activation=b"\0" * (4 * CONFIG.hidden)),
            request(session="f", layer_start=2, layer_end=9, tokens=[1]),
        ]
    )
    ok = replies[0]
    assert isinstance(ok, StepOutput)
    assert ok.token is not None
    assert ok.positions == 5
    codes = [r.code if isinstance(r, ExecutorError) else None for r in replies[1:]]
    assert codes == ["prompt_too_long", "session_lost", "bad_request", None, "bad_range"]
