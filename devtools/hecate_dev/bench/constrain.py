"""``hecate bench constrain``: what an answer held to a JSON Schema costs.

1. The mask a step pays, per library, on SmolLM2's 49,152 tokens: walking a valid
   answer's tokens, the time to say which tokens may come next (llguidance, as the nodes
   run it: a bit per token, turned into a bool per logit; outlines-core, when the bench
   extra installed it: its list of allowed tokens).
2. The engine's decode tokens/s with and without the schema, one process on every
   core, through the executor a node runs (``LlmExecutor``), in interleaved rounds of a
   few generations of each, every one as long as the schema's greedy answer (so both
   decode over the same lengths of context). Each constrained answer is checked: it
   must parse and validate against the schema; the free answers must all be the same
   text (greedy).
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import jsonschema

from hecate.llm.constrain import Constraints
from hecate.llm.executor import LlmExecutor
from hecate.llm.store import model_path
from hecate.llm.tokenizer import eos_ids, load_tokenizer
from hecate.model.executor import StepInput
from hecate.wire.common import OutputFormat

MODEL = "smollm2-135m"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
ANSWER = '{"name":"Ada Lovelace","age":36,"tags":["mathematics","poetry","engines"]}'
PROMPT = "Describe Ada Lovelace as JSON with her name, age and three tags."
REPEATS = 4  # generations of each kind a round


def mask_costs(walks: int = 20) -> dict[str, float]:
    """Median ms a step to compute the allowed tokens, walking :data:`ANSWER`."""
    path = model_path(MODEL)
    tokenizer = load_tokenizer(path)
    ids = tokenizer.encode(ANSWER).ids
    shape = OutputFormat(type="json_schema", schema=json.dumps(SCHEMA))
    constraints = Constraints(tokenizer, sorted(eos_ids(path)), 49152)
    times: list[float] = []
    for w in range(walks):
        for k in range(len(ids) + 1):
            t = time.perf_counter()
            allowed = constraints.allowed(f"walk-{w}", shape, ids[:k])
            times.append(time.perf_counter() - t)
            assert k == len(ids) or allowed[ids[k]], "a valid answer's token was refused"
    out = {"llguidance_ms": round(1000 * statistics.median(times), 4)}
    try:
        from outlines_core import Guide, Index, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema
    except ImportError:
        return out
    vocab: dict[bytes, list[int]] = {}
    eos = min(eos_ids(path))
    for i in range(49152):
        piece = constraints.piece(i)
        if i != eos and piece:
            vocab.setdefault(piece, []).append(i)
    t = time.perf_counter()
    index = Index(build_regex_from_schema(json.dumps(SCHEMA)), Vocabulary(eos, vocab))
    out["outlines_core_index_s"] = round(time.perf_counter() - t, 3)
    times = []
    for _ in range(walks):
        guide = Guide(index)
        for token in ids:
            t = time.perf_counter()
            allowed_ids = guide.get_tokens()
            times.append(time.perf_counter() - t)
            assert token in allowed_ids, "a valid answer's token was refused"
            guide.advance(token)
    out["outlines_core_ms"] = round(1000 * statistics.median(times), 4)
    return out


def generate(
    executor: LlmExecutor, session: str, shape: OutputFormat | None, tokens: int
) -> tuple[str, float, int]:
    """Greedy ``tokens`` (or to the end token) for :data:`PROMPT`: the text, the decode
    tokens/s after the first token, and how many tokens came."""
    common: dict[str, Any] = {
        "model_id": MODEL,
        "layer_start": 0,
        "layer_end": 30,
        "session": session,
        "decode_tokens": tokens,
        "output_format": shape,
    }
    out = executor.step(StepInput(messages=(("user", PROMPT),), **common))
    position, got, text = out.positions or 0, [out.token], [out.text]
    t0 = time.perf_counter()
    while len(got) < tokens and not out.eos:
        assert got[-1] is not None
        out = executor.step(
            StepInput(
                position=position,
                step=len(got),
                tokens=[got[-1]],
                sampled=tuple(t for t in got if t is not None),
                **common,
            )
        )
        position += 1
        got.append(out.token)
        if not out.eos:
            text.append(out.text)
    rate = (len(got) - 1) / (time.perf_counter() - t0)
    executor.release(session)
    return "".join(text), rate, len(got)


def run(rounds: int = 3, tokens: int = 48) -> dict[str, Any]:
    executor = LlmExecutor(MODEL, threads=None)
    executor.prepare([(0, 30)])
    shape = OutputFormat(type="json_schema", schema=json.dumps(SCHEMA))
    rates: dict[str, list[float]] = {"free": [], "schema": []}
    free_texts: set[str] = set()
    invalid: list[str] = []
    # Greedy, the schema's answer is the same every time: both run as many tokens as it
    # has, so that they decode over the same lengths of context.
    _, _, tokens = generate(executor, "warm", shape, tokens)
    counts: dict[str, list[int]] = {"free": [], "schema": []}
    for r in range(rounds):
        for name in ("free", "schema") if r % 2 == 0 else ("schema", "free"):
            # A short answer: several generations a round, timed together.
            decoded, spent = 0, 0.0
            for k in range(REPEATS):
                text, rate, n = generate(
                    executor, f"{name}-{r}-{k}", shape if name == "schema" else None, tokens
                )
                decoded, spent = decoded + n - 1, spent + (n - 1) / rate
            rates[name].append(round(decoded / spent, 1))
            counts[name].append(n)
            if name == "free":
                free_texts.add(text)
                continue
            try:
                jsonschema.validate(json.loads(text), SCHEMA)
            except (ValueError, jsonschema.ValidationError) as exc:
                invalid.append(f"round {r + 1}: {text!r}: {exc}")
    return {
        "tokens": tokens,
        "rounds": rounds,
        "mask": mask_costs(),
        "tokens_per_s": rates,
        "tokens_generated": counts,
        "repeats": REPEATS,
        "schema_over_free": [
            round(s / f, 3) for s, f in zip(rates["schema"], rates["free"], strict=True)
        ],
        "free_texts_equal": len(free_texts) == 1,
        "invalid": invalid,
    }
