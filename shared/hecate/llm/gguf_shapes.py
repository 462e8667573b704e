"""The tensors each block of a model runs, and their shapes checked against its header
(:mod:`hecate.llm.gguf_config`), so that a file whose header disagrees with its weights
is refused when it is added, never met in a node, mid-graph."""

from __future__ import annotations

from hecate.llm.gguf_config import LlamaConfig
from hecate.llm.gguf_file import BadGGUF, GGUFFile

#: a tensor's dimensions, each a word of :func:`check_shapes`'s sizes, in GGUF's order
#: (a matrix's inputs first; an expert's matrices have the experts last)
Dims = tuple[str, ...]

#: a block's tensors, each ``(name, dims)``
BLOCK_TENSORS: tuple[tuple[str, Dims], ...] = (
    ("attn_norm", ("hidden",)),
    ("attn_q", ("hidden", "q")),
    ("attn_k", ("hidden", "kv")),
    ("attn_v", ("hidden", "kv")),
    ("attn_output", ("q", "hidden")),
    ("ffn_norm", ("hidden",)),
    ("ffn_gate", ("hidden", "ffn")),
    ("ffn_up", ("hidden", "ffn")),
    ("ffn_down", ("ffn", "hidden")),
)
#: where Q, K, V and the gate and up are fused (:attr:`LlamaConfig.fused`)
FUSED = {"attn_q": ("attn_qkv", ("hidden", "qkv")), "ffn_gate": ("ffn_up", ("hidden", "ffn2"))}
#: a mixture of experts' feed-forward: the router, then each expert's gate, up and down
EXPERTS = (
    ("ffn_gate_inp", ("hidden", "experts")),
    ("ffn_gate_exps", ("hidden", "effn", "experts")),
    ("ffn_up_exps", ("hidden", "effn", "experts")),
    ("ffn_down_exps", ("effn", "hidden", "experts")),
)
QK_NORMS = (("attn_q_norm", ("head",)), ("attn_k_norm", ("head",)))
POST_NORMS = (("post_attention_norm", ("hidden",)), ("post_ffw_norm", ("hidden",)))


def block_tensors(c: LlamaConfig) -> tuple[tuple[str, Dims], ...]:
    """The weights (``blk.N.<name>.weight``) each block of ``c`` runs."""
    out: list[tuple[str, Dims]] = []
    for name, dims in BLOCK_TENSORS:
        if c.experts and name.startswith("ffn_") and name != "ffn_norm":
            continue
        if c.fused and name in ("attn_k", "attn_v", "ffn_up"):
            continue
        out.append(FUSED[name] if c.fused and name in FUSED else (name, dims))
    return (
        *out,
        *(EXPERTS if c.experts else ()),
        *(QK_NORMS if c.qk_norm else ()),
        *(POST_NORMS if c.post_norms else ()),
    )


def check_shapes(file: GGUFFile, config: LlamaConfig) -> None:
    """Every tensor the model runs is in ``file`` with the shape ``config`` (its header)
    implies, else :class:`BadGGUF` naming the first that is not: the embedding (and the
    output head when not tied), the final norm, and each block's norms, attention (with
    qwen2's biases) and feed-forward (or experts). Run when a model is added."""
    c = config
    size = {
        "hidden": c.hidden,
        "q": c.heads * c.head_dim,
        "kv": c.kv_heads * c.head_dim,
        "head": c.head_dim,
        "qkv": (c.heads + 2 * c.kv_heads) * c.head_dim,
        "ffn": c.ffn,
        "ffn2": 2 * c.ffn,
        "experts": c.experts,
        "effn": c.expert_ffn,
        "vocab": c.vocab,
    }
    why = (
        f"{c.arch}.embedding_length {c.hidden}, head_count {c.heads}, head_count_kv "
        f"{c.kv_heads}, heads of {c.head_dim}, feed_forward_length {c.ffn}, vocabulary "
        f"{c.vocab}"
    )

    def check(name: str, dims: Dims) -> None:
        want = tuple(size[d] for d in dims)
        t = file.tensors.get(name)
        if t is None:
            raise BadGGUF(f"{file.path}: no {name} (a model of {c.layers} blocks needs it)")
        if t.shape != want:
            raise BadGGUF(
                f"{file.path}: {name} is {list(t.shape)}, the metadata implies {list(want)} ({why})"
            )

    check("token_embd.weight", ("hidden", "vocab"))
    if not c.tied_head:
        check("output.weight", ("hidden", "vocab"))
    check("output_norm.weight", ("hidden",))
    for i in range(c.layers):
        for name, dims in block_tensors(c):
            check(f"blk.{i}.{name}.weight", dims)
        if c.qkv_bias:
            for name, width in (("attn_q", "q"), ("attn_k", "kv"), ("attn_v", "kv")):
                check(f"blk.{i}.{name}.bias", (width,))
