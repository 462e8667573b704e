"""The structured-output section: what holding an answer to a JSON Schema costs a token
(``hecate bench constrain``, :mod:`hecate_dev.bench.constrain`)."""

# Prose for people: its dashes and multiplication signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from hecate_dev.bench.report.markdown import Doc, Target, num, provenance, skipped, table
from hecate_dev.bench.report.paired import judged

TARGET = 0.9  # a schema keeps at least nine tenths of the free decode speed


def _count(r: Doc) -> str:
    counts = sorted({n for ns in r.get("tokens_generated", {}).values() for n in ns})
    return ", ".join(str(n) for n in counts) if counts else str(r["tokens"])


def section_constrain(env: Doc, img: str) -> tuple[str, list[Target]]:
    del img  # no picture
    r = env["report"]
    title = "## Answers held to a JSON Schema: what a token pays\n\n"
    if (absent := skipped(env, title)) is not None:
        return absent, []
    mask, rates, ratios = r["mask"], r["tokens_per_s"], r["schema_over_free"]
    masks = [["llguidance (the nodes')", num(mask["llguidance_ms"], 3), "a bit per token"]]
    if "outlines_core_ms" in mask:
        masks.append(
            [
                f"outlines-core (index built in {num(mask['outlines_core_index_s'], 3)} s)",
                num(mask["outlines_core_ms"], 3),
                "a list of the allowed tokens",
            ]
        )
    speeds = table(
        ["per round", "decode tokens/s"],
        [
            ["free", ", ".join(num(x, 1) for x in rates["free"])],
            ["held to the schema", ", ".join(num(x, 1) for x in rates["schema"])],
            ["held ÷ free", ", ".join(num(x, 3) for x in ratios)],
        ],
    )
    met, figure = judged(ratios, TARGET)
    checked = not r["invalid"] and r["free_texts_equal"]
    text = (
        f"{title}{provenance(env)}\n"
        "The mask a step pays, on SmolLM2's 49,152 tokens, walking a valid answer's tokens "
        "(median ms a step; what each library gives):\n\n"
        f"{table(['library', 'ms a step', 'gives'], masks)}\n\n"
        "The engine's decode tokens/s on every core through the nodes' executor, greedy, "
        "free and held to a schema of three fields, in "
        f"{r['rounds']} interleaved rounds of {r.get('repeats', 1)} generations of each, every "
        f"generation as long as the schema's answer ({_count(r)} tokens), so that both "
        "decode over the same lengths of context:"
        f"\n\n{speeds}\n\n"
        "Every answer held to the schema parsed and validated against it, and every free "
        "answer was the same greedy text: "
        + ("yes." if checked else f"NO ({r['invalid']}).")
        + "\n"
    )
    return text, [Target(f"an answer held to a schema ≥ {TARGET}× free tokens/s", figure, met)]
