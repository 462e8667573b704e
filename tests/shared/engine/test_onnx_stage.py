"""The ONNX Runtime stage on SmolLM2's own Q4_1 blocks, held against the numpy model.

The two differ by design in one place: MatMulNBits takes int8 activations (as llama.cpp
does), so logits move by up to about one unit against numpy's float32. Held to: step-0
logits correlated at 0.998 or more, the same greedy tokens wherever numpy's margin
between its two best is over 0.5 (below that either answer is the model's), and a layer
range split in three, or a batch of sessions, changing no token at all.
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import pytest

from hecate.llm.gguf_model import load_stage, model_config
from hecate.llm.llama import LlamaStage
from hecate.llm.onnx_stage import OnnxStage
from hecate.llm.store import model_path
from hecate.llm.tokenizer import chat_prompt, load_tokenizer

# SmolLM2, pulled and prepared once per run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("prepared_model")

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
]
TOKENS = 16
MARGIN = 0.5


@pytest.fixture(scope="module")
def numpy_model() -> LlamaStage:
    path = model_path("smollm2-135m")
    return LlamaStage(load_stage(path, 0, model_config(path).layers))


@pytest.fixture(scope="module")
def whole() -> OnnxStage:
    path = model_path("smollm2-135m")
    return OnnxStage(path, 0, model_config(path).layers, threads=2, slots=8, capacity=512)


def ids(prompt: str) -> list[int]:
    return list(load_tokenizer(model_path("smollm2-135m")).encode(prompt).ids)


def test_step_zero_logits_follow_numpy_s(numpy_model: LlamaStage, whole: OnnxStage) -> None:
    for prompt in PROMPTS:
        tokens = ids(prompt)
        want = numpy_model.logits(
            numpy_model.forward(numpy_model.embed(tokens), numpy_model.new_cache())
        )
        slot = whole.new_cache()
        got = whole.forward_batch([whole.embed(tokens)], [slot])[0][0]
        whole.free(slot)
        assert np.corrcoef(want, got)[0, 1] >= 0.998, prompt


def test_teacher_forced_greedy_tokens_agree_where_numpy_is_sure(
    numpy_model: LlamaStage, whole: OnnxStage
) -> None:
    """Both models read numpy's own continuation (teacher forcing, so one near-tie does
    not send the rest apart); at every step where numpy's best beats its second by more
    than :data:`MARGIN`, the stage's best is the same token."""
    judged = 0
    for prompt in PROMPTS:
        tokens = ids(prompt)
        cache, slot = numpy_model.new_cache(), whole.new_cache()
        x_np, x_ort = numpy_model.embed(tokens), whole.embed(tokens)
        for _ in range(TOKENS):
            want = numpy_model.logits(numpy_model.forward(x_np, cache))
            got = whole.forward_batch([x_ort], [slot])[0][0]
            top2 = np.sort(want)[-2:]
            if top2[1] - top2[0] > MARGIN:
                judged += 1
                assert int(np.argmax(got)) == int(np.argmax(want)), prompt
            token = int(np.argmax(want))
            x_np, x_ort = numpy_model.embed([token]), whole.embed([token])
        whole.free(slot)
    assert judged >= TOKENS * len(PROMPTS) // 2  # the check judged most steps


def greedy(stages: list[OnnxStage], tokens: list[int], n: int) -> list[int]:
    slots = [s.new_cache() for s in stages]
    x = stages[0].embed(tokens)
    out: list[int] = []
    try:
        for _ in range(n):
            for stage, slot in zip(stages, slots, strict=True):
                x = stage.forward_batch([x], [slot])[0]
            out.append(int(np.argmax(x[0])))
            x = stages[0].embed(out[-1:])
    finally:
        for stage, slot in zip(stages, slots, strict=True):
            stage.free(slot)
    return out


def test_three_stages_give_the_whole_range_s_numbers(whole: OnnxStage) -> None:
    """Cut in three, the range computes its very logits, bit for bit (and so its
    tokens): a chat prompt once turned " The" into "L" across the cut."""
    path = model_path("smollm2-135m")
    thirds = [OnnxStage(path, a, a + 10, threads=2, slots=4, capacity=512) for a in (0, 10, 20)]
    chat = chat_prompt([("user", "What is the capital of France?")])
    for prompt in [*PROMPTS, chat]:
        x = thirds[0].embed(ids(prompt))
        for stage in thirds:
            slot = stage.new_cache()
            x = stage.forward_batch([x], [slot])[0]
            stage.free(slot)
        slot = whole.new_cache()
        np.testing.assert_array_equal(x, whole.forward_batch([whole.embed(ids(prompt))], [slot])[0])
        whole.free(slot)
        assert greedy(thirds, ids(prompt), TOKENS) == greedy([whole], ids(prompt), TOKENS)


def test_a_batch_of_sessions_gives_each_its_own_tokens(whole: OnnxStage) -> None:
    """Sessions step together (decode rows in one run, prefills on their own), one of
    them starting late so that lengths differ and a free slot sits between them."""
    alone = {p: greedy([whole], ids(p), TOKENS) for p in PROMPTS}
    first = whole.new_cache()
    gap = whole.new_cache()  # held, never stepped: a padding row inside the span
    slots = [first, *(whole.new_cache() for _ in PROMPTS[1:])]
    assert first.index < gap.index < slots[1].index
    xs = [whole.embed(ids(p)) for p in PROMPTS]
    got: dict[str, list[int]] = {p: [] for p in PROMPTS}
    for step in range(TOKENS + 2):
        live = [
            j
            for j in range(len(PROMPTS))
            if (j != 2 or step >= 2) and len(got[PROMPTS[j]]) < TOKENS
        ]
        if not live:
            break
        outs = whole.forward_batch([xs[j] for j in live], [slots[j] for j in live])
        for j, logits in zip(live, outs, strict=True):
            token = int(np.argmax(logits[0]))
            got[PROMPTS[j]].append(token)
            xs[j] = whole.embed([token])
    for s in [gap, *slots]:
        whole.free(s)
    assert got == alone


def test_a_position_run_alone_is_computed_as_it_is_beside_others() -> None:
    """Bit for bit: a session's step alone, beside another session's, and (its only
    neighbour held) beside a held slot, whose own next step the padding row leaves as
    it would have been."""
    path = model_path("smollm2-135m")
    stage = OnnxStage(path, 10, 20, threads=1, slots=3, capacity=64)
    rng = np.random.default_rng(7)
    history = rng.standard_normal((5, 576), dtype=np.float32)
    step, other = (rng.standard_normal((1, 576), dtype=np.float32) for _ in range(2))
    a, b, c = (stage.new_cache() for _ in range(3))
    for slot in (a, b, c):
        stage.forward_batch([history], [slot])
    together = stage.forward_batch([step, step], [b, c])
    assert np.array_equal(together[0], together[1])
    alone = stage.forward_batch([step], [a])[0]  # beside b: held, its next position free
    assert np.array_equal(alone, together[0])
    # b's next step, after a's padding row wrote at b's next position, is c's, whose
    # history is b's and whose next position nobody wrote.
    after = stage.forward_batch([other, other], [b, c])
    assert np.array_equal(after[0], after[1])
    for slot in (a, b, c):
        stage.free(slot)
    assert stage.pads_alone in (True, False)  # as this machine's kernels measured


def test_sessions_spread_over_the_slots_move_together_and_compute_the_same() -> None:
    """A batch whose sessions have held slots between them (cached prefixes, another
    group's sessions) moves next to each other, once, and computes bit for bit what the
    same sessions next to each other from the start do, this step and the next."""
    path = model_path("smollm2-135m")
    rng = np.random.default_rng(11)
    history = rng.standard_normal((5, 576), dtype=np.float32)
    steps = [rng.standard_normal((3, 1, 576), dtype=np.float32) for _ in range(2)]
    outs: dict[str, list[list[np.ndarray]]] = {}
    for layout in ("together", "spread"):
        stage = OnnxStage(path, 10, 20, threads=1, slots=8, capacity=64)
        slots = [stage.new_cache() for _ in range(5 if layout == "spread" else 3)]
        for slot in slots:
            stage.forward_batch([history], [slot])
        batch = slots[::2] if layout == "spread" else slots  # spread: 0, 2 and 4
        others = [(s.index, s.length) for s in slots if s not in batch]
        outs[layout] = [stage.forward_batch(list(x), batch) for x in steps]
        indices = sorted(s.index for s in batch)
        assert indices[-1] - indices[0] == 2  # next to each other
        assert [(s.index, s.length) for s in slots if s not in batch] == others  # untouched
        assert all(s.length == 7 for s in batch)
        moved = 2 if layout == "spread" else 0  # 0 and 2 into the window 4, 5, 6
        assert stage.counts["moves"] == moved
        assert stage.counts["rows_computed"] - stage.counts["rows"] == 0  # no padding row
    for got, want in zip(outs["spread"], outs["together"], strict=True):
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def resident_bytes(array: np.ndarray) -> int:
    """How many bytes of ``array``'s pages the kernel backs (``mincore``)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    page = mmap.PAGESIZE
    start = array.ctypes.data - array.ctypes.data % page
    length = array.ctypes.data + array.nbytes - start
    vec = (ctypes.c_ubyte * (-(-length // page)))()
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec) == 0
    return sum(v & 1 for v in vec) * page


def test_a_session_s_cache_costs_the_positions_it_holds_and_is_given_back() -> None:
    path = model_path("smollm2-135m")
    stage = OnnxStage(path, 0, 2, threads=2, slots=4)  # the model's whole 8,192 positions
    config = stage.config
    held = [stage.new_cache() for _ in range(2)]
    for slot in held:
        stage.forward_batch([stage.embed(ids("The capital of France is") * 4)], [slot])
    positions = held[0].length
    # What the positions take, a page per head's rows at most over: never the slot's
    # whole capacity (with 2 MiB pages each head's first row cost 2 MiB).
    size = stage.kv_itemsize
    per_head = -(-positions * config.head_dim * size // mmap.PAGESIZE) * mmap.PAGESIZE
    bound = 2 * stage.blocks * config.kv_heads * (per_head + mmap.PAGESIZE)
    capacity_cost = 2 * stage.blocks * config.kv_heads * stage.capacity * config.head_dim * size
    for slot in held:
        used = sum(resident_bytes(pool[slot.index]) for pool in (*stage._k, *stage._v))
        assert 0 < used <= bound < capacity_cost / 100, (used, bound)
    stage.free(held[0])
    assert sum(resident_bytes(pool[held[0].index]) for pool in (*stage._k, *stage._v)) == 0
    assert sum(resident_bytes(pool[held[1].index]) for pool in (*stage._k, *stage._v)) > 0
