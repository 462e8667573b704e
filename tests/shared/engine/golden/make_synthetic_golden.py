"""Writes llama.cpp's reference for the engine on small synthetic models of every weight
type and attention shape it claims (tests/shared/engine/test_synthetic_golden.py).

For each case of :data:`CASES`: a float32 model of random weights is written by
``hecate_dev.synthetic_gguf`` (seeded, so the test can write the very same file), then
quantised by llama.cpp's own quantiser (``llama_model_quantize``, ``pure``: every
matrix, the embedding included, of the one type) and run by llama.cpp: the prompt in
one batch, then greedy decoding, one token a step. ``synthetic/<case>.json`` keeps the
prompt, llama.cpp's greedy ids and each step's margin (top logit minus the next),
a SHA-256 over the quantised tensors (name, type, bytes) and the versions;
``synthetic/<case>.npz`` keeps the step-0 logits. The quantised file itself is kept
(``synthetic/<case>.gguf``) only for the types whose quantiser exists only in llama.cpp
(the k-quants and the IQ4 types); for the others the test quantises the same floats
with ``gguf`` and checks the hash, which proves it made llama.cpp's bytes.
Cases named ``moe/...`` (mixtures of experts) go to ``synthetic/moe/``, apart from the
cases the engine's test takes (``synthetic/*.npz``). Their ``.npz`` also keeps
``router_probs``, [layer, position, expert]: llama.cpp's softmax over each layer's
experts at every position of the prompt and of the greedy steps (the top ``experts_used``
are the experts it ran), read from its graph as it computed them; their ``.json`` keeps
``routing``, per layer: how many distinct sets of experts were chosen, and the closest
call (the log-probability of the last expert chosen over the first left out) and where.
``synthetic/tokenizers.json`` keeps llama.cpp's token ids for a few texts under each
tokenizer the engine rebuilds: SentencePiece on a small vocabulary (``spm_vocabulary``),
and SmolLM2's vocabulary under each byte-level pre-tokenizer.

The models have no tokenizer (``tokenizer.ggml.model = no_vocab``; llama.cpp loads that
as is): a vocabulary of 256 ids keeps a k-quant file near 0.5 MB, where SmolLM2's 49,152
tokens would make every file 13 MB of embedding. The engine is fed token ids, so the
tokenizer has no part in what is compared.

Run by hand, with the ``bench`` extra installed (it builds llama-cpp-python)::

    .venv/bin/python tests/shared/engine/golden/make_synthetic_golden.py [CASE ...]

(naming cases writes only theirs, and not the tokenizers'.)
"""

from __future__ import annotations

import ctypes
import importlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q

from hecate.llm.gguf_file import GGUFFile
from hecate_dev.synthetic_gguf import QUANTISABLE, Shape, spm_vocabulary, tensors_sha256, write

HERE = Path(__file__).resolve().parent / "synthetic"
SEED = 7
PROMPT_LENGTH = 48
STEPS = 32
#: small enough to commit, every matrix's inputs a whole number of k-quant blocks (256)
BASE = Shape(layers=2, hidden=256, heads=4, kv_heads=2, ffn=256, vocab=256, context=256)
#: Gemma 3's layout at BASE's size: layer 0 slides (a window of 16 tokens, which the 48
#: of the prompt and the 32 steps pass), layer 1 is global, each with a RoPE base of its
#: own; heads of 128 on a width of 256, as qwen3-qk-norm. (Its norms after attention and
#: FFN are near ``GEMMA_POST_NORM``: near one, every step repeated the prompt's last
#: token, and leaving the window out changed none of them.)
GEMMA3 = Shape(
    **{
        **BASE.__dict__,
        "arch": "gemma3",
        "head_dim": 128,
        "rms_eps": 1e-6,
        "window": 16,
        "window_pattern": 2,
        "rope_base": 1_000_000.0,
        "rope_base_swa": 10_000.0,
    }
)
#: the final norm of the cases from phi3-fused on (``Shape.final_norm``): at one, their
#: logits spread so little that the two best were more than 0.5 apart at only 3 of the
#: 32 steps (phi3-fused; moe/mixtral 2), which leaves the check next to nothing to hold
#: a model to; three times the logits give the same tokens and 15 such steps or more
FINAL_NORM = 3.0
#: Phi-3's layout at BASE's size: Q, K and V in one matrix, the FFN's gate and up in one,
#: and a head of its own, as Phi-3 mini's
PHI3 = Shape(**{**BASE.__dict__, "arch": "phi3", "tied": False, "final_norm": FINAL_NORM})
#: Mixtral's layout (GGUF arch llama) at BASE's size: 4 experts a block, 2 of them a
#: token, and a head of its own, as Mixtral's (tied to the embedding, every step of this
#: one gave the same token)
MIXTRAL = Shape(
    **{
        **BASE.__dict__,
        "experts": 4,
        "experts_used": 2,
        "tied": False,
        "final_norm": FINAL_NORM,
    }
)
#: Qwen3-MoE's: qwen3-qk-norm's attention, 4 experts a block of 512 each (beside a dense
#: width of 256, and llama.cpp's fallback of 256 / 2 when the key is missing), 2 a token,
#: and a head of its own, as Qwen3-30B-A3B's
QWEN3MOE = Shape(
    **{
        **BASE.__dict__,
        "arch": "qwen3moe",
        "head_dim": 128,
        "experts": 4,
        "experts_used": 2,
        "expert_ffn": 512,
        "tied": False,
        "final_norm": FINAL_NORM,
    }
)

#: case → (weight type, shape)
CASES: dict[str, tuple[Q, Shape]] = {
    **{f"type-{q.name}": (q, BASE) for q in (Q.F32, Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_1)},
    **{f"type-{q.name}": (q, BASE) for q in (Q.Q5_0, Q.Q5_1, Q.BF16)},
    **{f"type-{q.name}": (q, BASE) for q in (Q.Q4_K, Q.Q5_K, Q.Q6_K)},
    **{f"type-{q.name}": (q, BASE) for q in (Q.IQ4_NL, Q.IQ4_XS, Q.Q3_K, Q.Q2_K)},
    "gqa-1to1": (Q.Q8_0, Shape(**{**BASE.__dict__, "kv_heads": 4})),
    "gqa-3to1": (Q.Q8_0, Shape(**{**BASE.__dict__, "hidden": 384, "heads": 6, "kv_heads": 2})),
    "gqa-4to1": (Q.Q8_0, Shape(**{**BASE.__dict__, "kv_heads": 1})),
    "head-dim-128": (Q.Q8_0, Shape(**{**BASE.__dict__, "heads": 2, "kv_heads": 1})),
    "separate-head": (Q.Q8_0, Shape(**{**BASE.__dict__, "tied": False})),
    "qwen2-qkv-bias": (Q.Q8_0, Shape(**{**BASE.__dict__, "arch": "qwen2"})),
    "llama3-rope-scaling": (Q.Q8_0, Shape(**{**BASE.__dict__, "rope_scaling": "llama3"})),
    "linear-rope-scaling": (Q.Q8_0, Shape(**{**BASE.__dict__, "rope_scaling": "linear"})),
    # heads of 128 on a width of 256: Q is 512 wide, and a head width taken as 64 shows
    "qwen3-qk-norm": (Q.Q8_0, Shape(**{**BASE.__dict__, "arch": "qwen3", "head_dim": 128})),
    "gemma3": (Q.Q8_0, GEMMA3),
    "phi3-fused": (Q.Q8_0, PHI3),
    "moe/mixtral": (Q.Q8_0, MIXTRAL),
    "moe/qwen3moe": (Q.Q8_0, QWEN3MOE),
}

#: llama.cpp's file types (``llama_ftype``) for each weight type
FTYPES = {Q.F32: 0, Q.F16: 1, Q.Q4_0: 2, Q.Q4_1: 3, Q.Q8_0: 7, Q.Q5_0: 8, Q.Q5_1: 9, Q.BF16: 32}
FTYPES.update({Q.Q4_K: 15, Q.Q5_K: 17, Q.Q6_K: 18, Q.IQ4_NL: 25, Q.IQ4_XS: 30})
FTYPES.update({Q.Q2_K: 10, Q.Q3_K: 11})  # Q3_K_S: every matrix Q3_K when pure


def prompt(vocab: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(SEED).integers(0, vocab, PROMPT_LENGTH)]


def _margin(logits: np.ndarray) -> float:
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])


def quantised(llama: Any, source: Path, kind: Q, out: Path) -> None:
    params = llama.llama_model_quantize_default_params()
    params.ftype = FTYPES[kind]
    params.pure = True
    params.nthread = 2
    if llama.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params)):
        raise RuntimeError(f"llama.cpp could not quantise {source} to {kind.name}")


#: types whose repacked CPU kernels this llama.cpp build crashes on (an AVX-512 host,
#: IQ4_XS: a segmentation fault at the first batch): run on the plain kernels instead
NO_REPACK = (Q.IQ4_XS,)


def _amx() -> bool:
    """Whether this host has Intel's AMX, whose kernels llama.cpp then takes for every
    quantised type they cover (Q4_0, Q8_0, the k-quants...) and which this build crashes
    on at the first batch (a segmentation fault): there, every case runs on the plain
    kernels, which give the committed Q8_0 cases' logits bit for bit."""
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.is_file() and "amx_int8" in cpuinfo.read_text()


def _repacking(on: bool) -> None:
    """Whether models loaded from now on use the repacked kernels (llama.cpp's
    ``use_extra_bufts``, on by default)."""
    low: Any = importlib.import_module("llama_cpp.llama_cpp")
    default = getattr(low, "_plain_default_params", low.llama_model_default_params)
    low._plain_default_params = default

    def params() -> Any:
        p = default()
        p.use_extra_bufts = on
        return p

    low.llama_model_default_params = params


#: llama.cpp's name for a layer's router probabilities: the softmax over its experts,
#: before the top-k, ``[experts, tokens]`` in ggml's order (``ffn_moe_probs-<layer>``)
ROUTER_PROBS = "ffn_moe_probs-"


def _watching_router(on: bool) -> dict[int, list[np.ndarray]]:
    """Whether contexts made from now on copy each layer's router probabilities as their
    graph computes them: an eval callback (llama.cpp's ``cb_eval``) asks for every
    ``ffn_moe_probs-<layer>`` and copies it into the lists returned, by layer, one array
    of ``[tokens, experts]`` a batch."""
    low: Any = importlib.import_module("llama_cpp.llama_cpp")
    default = getattr(low, "_plain_context_params", low.llama_context_default_params)
    low._plain_context_params = default
    seen: dict[int, list[np.ndarray]] = {}
    ggml = ctypes.CDLL(str(Path(low._base_path) / "libggml-base.so"))
    for name, restype in (
        ("ggml_get_name", ctypes.c_char_p),
        ("ggml_nelements", ctypes.c_int64),
        ("ggml_get_data", ctypes.c_void_p),
    ):
        getattr(ggml, name).restype = restype
        getattr(ggml, name).argtypes = [ctypes.c_void_p]

    def watch(tensor: int, ask: bool, _: Any) -> bool:
        name = ggml.ggml_get_name(tensor).decode()
        layer = name.removeprefix(ROUTER_PROBS)
        if not name.startswith(ROUTER_PROBS) or not layer.isdigit():
            return False  # asked (only asked) for a tensor not wanted
        if ask:
            return True
        # A softmax's output, a tensor of its own: contiguous. Returning true goes on
        # with the graph (an exception in here returns false, which stops it, and the
        # watched run then answers otherwise).
        n = ggml.ggml_nelements(tensor)
        data = (ctypes.c_float * n).from_address(ggml.ggml_get_data(tensor))
        seen.setdefault(int(layer), []).append(np.array(data, dtype=np.float32))
        return True

    callback = low.ggml_backend_sched_eval_callback(watch)

    def params() -> Any:
        p = default()
        if on:
            p.cb_eval = callback
        return p

    low.llama_context_default_params = params
    low._router_callback = callback  # alive as long as the contexts that call it
    return seen


def routing(llama: Any, path: Path, ids: list[int], shape: Shape, greedy: list[int]) -> np.ndarray:
    """llama.cpp's router probabilities, ``[layer, position, expert]``, over the prompt
    and the greedy steps, from a second run watched (which must answer as the first)."""
    seen = _watching_router(True)
    try:
        again, _, _ = run(llama, path, ids)
    finally:
        _watching_router(False)
    if again != greedy:
        raise RuntimeError(f"{path}: watched, llama.cpp answered otherwise")
    probs = [np.concatenate(seen[i]).reshape(-1, shape.experts) for i in range(shape.layers)]
    return np.stack([p[-(len(ids) + STEPS) :] for p in probs])


def routing_summary(probs: np.ndarray, used: int) -> dict[str, list[int] | list[float]]:
    """Per layer: the distinct sets of experts chosen, and the closest call: the log of
    the last chosen's probability over the first left out's, and at which position."""
    ranked = np.sort(np.log(probs), axis=-1)[..., ::-1]
    gaps = ranked[..., used - 1] - ranked[..., used]
    chosen = np.sort(np.argsort(-probs, axis=-1)[..., :used], axis=-1)
    return {
        "distinct_sets": [len({tuple(c) for c in layer.tolist()}) for layer in chosen],
        "closest_call": [round(float(g.min()), 5) for g in gaps],
        "closest_call_at": [int(g.argmin()) for g in gaps],
    }


def run(llama: Any, path: Path, ids: list[int]) -> tuple[list[int], list[float], np.ndarray]:
    llm: Any = llama.Llama(
        model_path=str(path), n_threads=2, n_ctx=128, logits_all=True, verbose=False
    )
    llm.eval(ids)
    logits = np.asarray(llm.scores[len(ids) - 1], dtype=np.float32).copy()
    step0 = logits.copy()
    out, margins = [], []
    for _ in range(STEPS):
        token = int(np.argmax(logits))
        out.append(token)
        margins.append(_margin(logits))
        llm.eval([token])
        logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32).copy()
    return out, margins, step0


#: what the tokenizers are held to: spaces, digits, accents and emoji (byte fallback),
#: special tokens, code
TEXTS = (
    "The capital of France is",
    "Hello  world\n\nnew line, é and 😀 at 12345 o'clock",
    " leading space, I'm sure they've",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)",
    "<s>x</s><|im_start|>user",
)
#: the byte-level pre-tokenizers checked on SmolLM2's vocabulary (llama.cpp splits by
#: the name in ``tokenizer.ggml.pre``, whatever the vocabulary)
PRE_TOKENIZERS = ("smollm", "gpt-2", "llama-bpe", "qwen2")


def tokenizer_cases(smollm2: Path) -> dict[str, dict[str, Any]]:
    """Each tokenizer case's metadata: SentencePiece on a small vocabulary of its own,
    and SmolLM2's vocabulary under each byte-level pre-tokenizer."""
    meta = GGUFFile(smollm2).metadata
    base = {
        k: meta[k]
        for k in meta
        if k.startswith("tokenizer.ggml.") and k != "tokenizer.chat_template"
    }
    cases = {"spm": spm_vocabulary()}
    for pre in PRE_TOKENIZERS:
        cases[f"bpe-{pre}"] = {**base, "tokenizer.ggml.pre": pre}
    return cases


def tokenizers(llama: Any, folder: Path) -> None:
    from hecate.llm.store import pull

    out = {}
    for case, meta in tokenizer_cases(pull("smollm2-135m")).items():
        path = write(folder / f"{case}.gguf", Q.F32, Shape(layers=1), tokenizer=meta)
        llm: Any = llama.Llama(model_path=str(path), vocab_only=True, verbose=False)
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        out[case] = {
            text: llm.tokenize(text.encode(), add_bos=add_bos, special=True) for text in TEXTS
        }
        print(f"tokenizer {case}: {sum(len(v) for v in out[case].values())} ids")
    golden = {"llama_cpp_python": llama.__version__, "texts": list(TEXTS), "ids": out}
    (HERE / "tokenizers.json").write_text(json.dumps(golden, indent=1) + "\n")


def main(only: list[str]) -> None:
    llama = importlib.import_module("llama_cpp")
    HERE.mkdir(exist_ok=True)
    amx = _amx()
    if not only:
        with tempfile.TemporaryDirectory() as tmp:
            tokenizers(llama, Path(tmp))
    with tempfile.TemporaryDirectory() as tmp:
        for case, (kind, shape) in CASES.items():
            if only and case not in only:
                continue
            (HERE / case).parent.mkdir(exist_ok=True)
            source = write(Path(tmp) / "f32.gguf", Q.F32, shape, SEED, floats=True)
            path = HERE / f"{case}.gguf" if kind not in QUANTISABLE else Path(tmp) / "q.gguf"
            quantised(llama, source, kind, path)
            ids = prompt(shape.vocab)
            repacked = kind not in NO_REPACK and not amx
            _repacking(repacked)
            greedy, margins, step0 = run(llama, path, ids)
            golden = {
                "case": case,
                "type": kind.name,
                "shape": shape.__dict__,
                "seed": SEED,
                "prompt": ids,
                "greedy": greedy,
                "margins": margins,
                "tensors_sha256": tensors_sha256(path),
                "file_kept": kind not in QUANTISABLE,
                "llama_cpp_python": llama.__version__,
                "repacked": repacked,
            }
            arrays: dict[str, Any] = {"step0_logits": step0}
            if shape.experts:
                arrays["router_probs"] = routing(llama, path, ids, shape, greedy)
                golden["routing"] = routing_summary(arrays["router_probs"], shape.experts_used)
                print(f"{case}: routing {golden['routing']}")
            (HERE / f"{case}.json").write_text(json.dumps(golden, indent=1) + "\n")
            np.savez_compressed(HERE / f"{case}.npz", **arrays)
            confident = sum(m > 0.5 for m in margins)
            print(f"{case}: {kind.name}, {confident}/{STEPS} steps with margin > 0.5")


if __name__ == "__main__":
    main(sys.argv[1:])
