"""Cached prompt prefixes: the store's keys and bounds (pure), and SmolLM2's three stages
starting a prompt from a prefix another request of the same tenant ran: bit-equal to
running it whole, never found for another tenant, and a stage that lost it says so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate.llm.executor import LlmExecutor
from hecate.llm.prefixes import BLOCK, Prefixes, block_keys
from hecate.model.executor import ExecutorError, StepInput, StepOutput

MODEL = "smollm2-135m"
RANGES = [(0, 10), (10, 20), (20, 30)]


class Cache:
    def __init__(self, length: int) -> None:
        self.length = length

    def nbytes(self) -> int:
        return self.length


# -- the store, pure ------------------------------------------------------------------


@given(st.lists(st.integers(0, 49151), max_size=200), st.lists(st.integers(0, 49151), max_size=200))
def test_two_prompts_share_exactly_the_keys_of_the_whole_blocks_they_share(
    a: list[int], b: list[int]
) -> None:
    ka, kb = block_keys("t", a), block_keys("t", b)
    assert len(ka) == len(a) // BLOCK
    for j in range(min(len(ka), len(kb))):
        same = a[: (j + 1) * BLOCK] == b[: (j + 1) * BLOCK]
        assert (ka[j] == kb[j]) == same


@given(st.lists(st.integers(0, 49151), min_size=BLOCK, max_size=200))
def test_one_tenants_keys_are_never_anothers(tokens: list[int]) -> None:
    assert not set(block_keys("alice", tokens)) & set(block_keys("bob", tokens))


def test_a_prefix_is_found_in_its_scope_only_and_at_most_the_limit() -> None:
    store = Prefixes(block=4)
    tokens = list(range(12))
    keys = block_keys("alice", tokens, block=4)
    cache = Cache(12)
    store.name("alice", keys, cache, 12)
    assert store.longest("alice", keys, limit=11) == 8  # not all 12: one must be computed
    assert store.find("alice", keys[1]) is cache
    assert store.longest("bob", block_keys("bob", tokens, block=4), limit=11) == 0
    # Bob holding Alice's keys (he cannot make them) still finds nothing: scope checked.
    assert store.longest("bob", keys, limit=11) == 0
    assert store.longest("alice", keys, limit=3) == 0  # not one whole block


def test_an_ended_session_is_kept_for_its_prefix_until_past_the_bound() -> None:
    store = Prefixes(block=4, max_kept=2)
    caches = [Cache(8) for _ in range(3)]
    for i, cache in enumerate(caches):
        store.name("t", block_keys("t", [i] * 8, block=4), cache, 8)
        assert store.ended(cache)  # kept, not to be freed
    assert store.overflow() == [caches[0]]  # the least recently used goes
    assert store.longest("t", block_keys("t", [0] * 8, block=4), limit=8) == 0
    assert store.longest("t", block_keys("t", [1] * 8, block=4), limit=8) == 8
    assert store.give_up_one(but=caches[1]) is caches[2]
    plain = Cache(3)  # named by no key: its caller frees it
    assert not store.ended(plain)


def test_an_ended_cache_whose_keys_a_newer_one_took_is_let_go() -> None:
    store = Prefixes(block=4)
    keys = block_keys("t", list(range(8)), block=4)
    old, new = Cache(8), Cache(8)
    store.name("t", keys, old, 8)
    assert store.ended(old)  # kept: its keys name it
    assert store.overflow() == []
    store.name("t", keys, new, 8)  # the same prompt again: the keys move to the newer
    assert store.find("t", keys[1]) is new
    assert store.overflow() == [old]  # named by nothing now: freed
    assert not store.ended(Cache(8))
    assert store.ended(new)


def test_a_lost_session_is_forgotten() -> None:
    store = Prefixes(block=4)
    cache = Cache(8)
    keys = block_keys("t", list(range(8)), block=4)
    store.name("t", keys, cache, 8)
    store.drop(cache)
    assert store.longest("t", keys, limit=8) == 0
    assert len(store) == 0


# -- SmolLM2's stages --------------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf() -> Path:
    from hecate.llm.store import pull

    return pull(MODEL, progress=lambda _line: None)


def generate(
    ex: LlmExecutor, session: str, prompt: str, scope: str | None, tokens: int = 6
) -> tuple[list[int], int]:
    """Greedy tokens of ``prompt`` through the three ranges, hop by hop, and the
    positions the first stage took from its cache."""
    position, reused = 0, 0
    fed: list[int] | None = None
    prompt_ids: list[int] | None = None
    generated: list[int] = []
    for step in range(tokens):
        act, ran, step_reused = b"", 0, 0
        for start, end in RANGES:
            out = ex.step(
                StepInput(
                    model_id=MODEL,
                    layer_start=start,
                    layer_end=end,
                    session=session,
                    position=position,
                    step=step,
                    prompt=prompt if start == 0 else "",
                    tokens=fed if start == 0 else None,
                    activation=act,
                    cache_scope=scope,
                    prompt_tokens=prompt_ids if position < len(prompt_ids or []) else None,
                    reused=step_reused if start else 0,
                )
            )
            assert isinstance(out, StepOutput)
            if start == 0:
                step_reused = out.reused
                prompt_ids = out.prompt_tokens or prompt_ids
            act, ran = out.activation, out.positions or 0
        reused = reused or step_reused
        assert out.token is not None
        generated.append(out.token)
        position += ran
        fed = [out.token]
    for start, end in RANGES:
        ex._ranges[(start, end)].close(session)
    return generated, reused


SYSTEM = (
    "You are a careful assistant for a library. Answer in one short sentence, name the "
    "shelf where the book is kept, and never invent a title that is not in the catalogue. "
) * 3


@pytest.mark.usefixtures("prepared_model")
def test_a_prompt_starting_as_another_did_reuses_it_and_answers_bit_equal(gguf: Path) -> None:
    ex = LlmExecutor(MODEL, gguf, threads=1)
    ex.prepare(RANGES)
    first = SYSTEM + "Where is Moby Dick?"
    second = SYSTEM + "Where is a book about whales, by Melville?"
    alone, reused = generate(ex, "cold", second, scope=None)
    assert reused == 0
    _, reused = generate(ex, "a1", first, scope="alice")
    assert reused == 0  # nothing cached yet
    warm, reused = generate(ex, "a2", second, scope="alice")
    assert reused > 0
    assert reused % BLOCK == 0
    assert warm == alone  # the cache's positions are the ones a whole run computes
    # Another tenant, the same text: nothing of Alice's is found.
    other, reused = generate(ex, "b1", second, scope="bob")
    assert reused == 0
    assert other == alone
    hits = [ex._ranges[r].prefixes.hits for r in RANGES]
    assert hits == [1, 1, 1]  # the first stage found it; the others took as many


@pytest.mark.usefixtures("prepared_model")
def test_a_stage_without_the_prefix_says_prefix_lost(gguf: Path) -> None:
    ex = LlmExecutor(MODEL, gguf, threads=1)
    ex.prepare(RANGES)
    generate(ex, "a1", SYSTEM + "Where is Moby Dick?", scope="alice")
    out = ex.step(
        StepInput(
            model_id=MODEL,
            layer_start=0,
            layer_end=10,
            session="a2",
            prompt=SYSTEM + "Where is Emma?",
            cache_scope="alice",
        )
    )
    assert out.reused > 0
    # The middle stage restarted meanwhile: its cache is gone.
    middle = ex._ranges[(10, 20)]
    for cache in middle.prefixes.overflow() + [
        c for c in [middle.prefixes.give_up_one()] if c is not None
    ]:
        middle.stage.free(cache)
    rows = np.frombuffer(out.activation, dtype="<f4").size // 576
    with pytest.raises(ExecutorError) as lost:
        ex.step(
            StepInput(
                model_id=MODEL,
                layer_start=10,
                layer_end=20,
                session="a2",
                activation=out.activation,
                cache_scope="alice",
                prompt_tokens=out.prompt_tokens,
                reused=out.reused,
            )
        )
    assert lost.value.code == "prefix_lost"
    assert rows > 0
