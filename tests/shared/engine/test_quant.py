"""GGUF blocks repacked for MatMulNBits stand for exactly the weights gguf dequantises."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnxruntime as ort
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from hecate.llm.onnx_graph import MS, Graph
from hecate.llm.quant import Packed, UnsupportedWeights, pack, unpack
from hecate_dev.synthetic_gguf import LAYOUT, random_blocks


def blocks(kind: Q, n: int, k: int, seed: int) -> np.ndarray:
    """Random rows of ``kind`` blocks with finite scales, as the GGUF reader gives them."""
    return random_blocks(kind, n, k, np.random.default_rng(seed))


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal up to float32 rounding: where a type keeps a minimum, ``s·q - m`` is run as
    ``s·(q - z) + (s·z - m)``, whose terms round on the scale of the block's largest."""
    np.testing.assert_allclose(
        got, want, rtol=0.0, atol=float(4 * np.finfo(np.float32).eps * np.abs(want).max())
    )


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(sorted(LAYOUT, key=lambda q: q.value)),
    n=st.integers(1, 9),
    k_blocks=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_repacked_matrix_is_the_gguf_s_own(kind: Q, n: int, k_blocks: int, seed: int) -> None:
    k = LAYOUT[kind][0] * k_blocks
    raw = blocks(kind, n, k, seed)
    want = dequantize(raw, kind).reshape(n, k).T  # [K, N], as x @ W reads it
    packed = pack("blk.0.test.weight", kind, raw, n, k)
    assert_same(unpack(packed), want)


def test_float_weights_stay_float() -> None:
    w = np.arange(12, dtype=np.float32).reshape(3, 4)  # 3 outputs of 4 inputs
    packed = pack("output_norm.weight", Q.F32, w, 3, 4)
    assert packed.bits == 0
    np.testing.assert_array_equal(unpack(packed), w.T)


def test_a_type_without_a_kernel_is_refused_by_name() -> None:
    raw = np.zeros((2, 110), np.uint8)
    with pytest.raises(UnsupportedWeights, match=r"blk\.3\.ffn_down\.weight: weight type IQ3_S"):
        pack("blk.3.ffn_down.weight", Q.IQ3_S, raw, 2, 256)


@pytest.mark.parametrize("kind", list(LAYOUT), ids=lambda q: q.name)
def test_every_supported_type_round_trips(kind: Q) -> None:
    """Each type once for sure (the property above draws them at random)."""
    n, k = 3, 2 * LAYOUT[kind][0]
    raw = blocks(kind, n, k, seed=7)
    want = dequantize(raw, kind).reshape(n, k).T
    assert_same(unpack(pack("t", kind, raw, n, k)), want)


def run_linear(packed: Packed, x: np.ndarray) -> np.ndarray:
    """``x`` [rows, K] through the graph's product of ``packed``, in ONNX Runtime."""
    g = Graph()
    y = g.linear("x", packed, "w")
    graph = helper.make_graph(
        g.nodes,
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None, packed.k])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)],
        g.inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)]
    )
    model.ir_version = 10
    options = ort.SessionOptions()
    names = list(g.weights)  # handed over, as a stage's are
    values = [ort.OrtValue.ortvalue_from_numpy(g.weights[n]) for n in names]
    options.add_external_initializers(names, values)
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    out: np.ndarray = session.run(None, {"x": x[None]})[0][0]
    return out


@pytest.mark.parametrize("kind", [Q.Q4_1, Q.Q4_K, Q.Q5_K], ids=lambda q: q.name)
def test_a_residual_in_eight_bits_moves_a_product_by_a_few_parts_in_a_thousand(kind: Q) -> None:
    """What integer zero points leave of a block's minimum goes through the int8 kernel
    (``onnx_ops._eight_bits``): the product differs from the one with that residual in
    float64 by no more than its 8-bit rounding and the input sums' allows."""
    n, k = 64, 4 * LAYOUT[kind][0]
    raw = blocks(kind, n, k, seed=3)
    packed = pack("t", kind, raw, n, k)
    assert packed.offset is not None
    assert packed.zeros is not None
    x = np.random.default_rng(4).standard_normal((3, k)).astype(np.float32)
    main = run_linear(dataclasses.replace(packed, offset=None), x)
    sums = x.reshape(3, -1, packed.block).sum(-1).astype(np.float64)
    residual = packed.offset.astype(np.float64)  # [K/32, N]
    want = main + sums @ residual
    got = run_linear(packed, x)
    a, r = np.abs(sums), np.abs(residual)
    # each residual off by half a step of its column's 8 bits; each sum by its row's
    bound = a.sum(1, keepdims=True) * r.max(0) / 254 + a.max(1, keepdims=True) * r.sum(0) / 254
    bound *= 2  # the int8 kernel's own rounding besides
    assert np.all(np.abs(got - want) <= bound + 1e-6)
    assert not np.array_equal(got, main)  # the residual was there to add


@pytest.mark.parametrize("kind", [Q.Q5_0, Q.Q5_1, Q.IQ4_NL, Q.IQ4_XS], ids=lambda q: q.name)
@pytest.mark.parametrize("seed", range(4))
def test_five_bit_and_table_codes_are_the_gguf_s_own_in_eight_bits(kind: Q, seed: int) -> None:
    n, k = 5, 2 * LAYOUT[kind][0] if LAYOUT[kind][0] > 32 else 96
    raw = blocks(kind, n, k, seed)
    packed = pack("blk.0.test.weight", kind, raw, n, k)
    assert packed.bits == 8  # the kernel's format: a byte a weight, never re-quantised
    assert_same(unpack(packed), dequantize(raw, kind).reshape(n, k).T)


@pytest.mark.parametrize("kind", [Q.Q2_K, Q.Q3_K], ids=lambda q: q.name)
@pytest.mark.parametrize("seed", range(4))
def test_two_and_three_bit_codes_are_the_gguf_s_own_in_four_bits(kind: Q, seed: int) -> None:
    n, k = 3, 512
    raw = blocks(kind, n, k, seed)
    packed = pack("blk.0.test.weight", kind, raw, n, k)
    assert (packed.bits, packed.block) == (4, 16)
    assert_same(unpack(packed), dequantize(raw, kind).reshape(n, k).T)


def test_bfloat16_weights_are_float32_s_top_half_exactly() -> None:
    floats = np.random.default_rng(3).normal(0, 0.05, size=(4, 64)).astype(np.float32)
    raw = quantize(floats, Q.BF16)
    packed = pack("blk.0.test.weight", Q.BF16, raw, 4, 64)
    assert packed.bits == 0
    np.testing.assert_array_equal(unpack(packed), dequantize(raw, Q.BF16).reshape(4, 64).T)
