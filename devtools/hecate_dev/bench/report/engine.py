"""The engine's sections: one process at 1 and 16 sessions beside the numpy model and
llama.cpp, with what a third of the model holds (``hecate bench engine``,
:mod:`hecate_dev.bench.engine`); and a long prompt through 3 stages, the engine against
the numpy model (``hecate bench long``, :mod:`hecate_dev.bench.long_prefill`)."""

# Prose for people: its dashes and multiplication signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from hecate_dev.bench.report.markdown import Doc, Target, num, provenance, skipped, table
from hecate_dev.bench.report.paired import judged

BATCH_TOKENS = 200.0  # aggregate tokens/s of one process at 16 sessions, at least
BATCH_OVER_ONE = 3.5  # 16 sessions over the same round's single session, at least
LLAMA_CPP = 1.0  # the engine's decode step over llama.cpp's, at least (as tokens/s)
THIRD_OF_MEMORY = 0.45  # a third of the blocks over the whole model, at most


def section_engine(env: Doc, img: str) -> tuple[str, list[Target]]:
    del img  # no picture
    r = env["report"]
    title = "## The engine in one process: 1 and 16 sessions, and what a node holds\n\n"
    if (absent := skipped(env, title)) is not None:
        return absent, []
    b = r["batch"]
    by_round = r["onnx_tokens_per_s_by_round"]
    rows = [
        [
            "the engine (ONNX Runtime, the GGUF's blocks)",
            f"{num(r['onnx_b1_ms'], 2)} / {num(r['onnx_b1_tokens_per_s'])}",
            f"{num(r[f'onnx_b{b}_ms'], 2)} / {num(r[f'onnx_b{b}_tokens_per_s'])}",
        ],
        [
            "the numpy model (float32, the reference)",
            f"{num(r['numpy_b1_ms'], 2)} / {num(r['numpy_b1_tokens_per_s'])}",
            f"{num(r[f'numpy_b{b}_ms'], 2)} / {num(r[f'numpy_b{b}_tokens_per_s'])}",
        ],
    ]
    many, figure = judged(by_round[str(b)], BATCH_TOKENS, unit=" tokens/s", digits=1)
    aggregate = f"one process, {b} sessions: ≥ {num(BATCH_TOKENS, 0)} tokens/s aggregate"
    targets = [Target(aggregate, figure, many)]
    over, figure = judged(r["onnx_batch_over_single_by_round"], BATCH_OVER_ONE)
    what = f"one process, {b} sessions ≥ {BATCH_OVER_ONE}× its 1 session's tokens/s"
    targets.append(Target(what, figure, over))
    if "llama_cpp_b1_ms" in r:
        rows.append(
            [r["llama_cpp"], f"{num(r['llama_cpp_b1_ms'], 2)} / "
             f"{num(r['llama_cpp_b1_tokens_per_s'])}", "not run"]
        )  # fmt: skip
        met, figure = judged(r["engine_over_llama_cpp_by_round"], LLAMA_CPP)
        targets.append(
            Target(f"one decode step alone ≥ {LLAMA_CPP}× llama.cpp's (engine bench)", figure, met)
        )
        reference = f"{r['llama_cpp']} on the same GGUF and prompt (greedy decoding, timed alike). "
    else:
        reference = f"llama.cpp not measured: {r['llama_cpp']}. "
    mem = r["memory"]
    (whole_key, whole), (third_key, third) = ((k, v) for k, v in mem.items() if isinstance(v, dict))
    share = mem["third_over_whole"]
    targets.append(
        Target(
            f"memory: a node holding 10 of 30 blocks ≤ {THIRD_OF_MEMORY}× one holding all 30",
            f"{num(share, 2)}× ({third['sessions_mib']} MiB against {whole['sessions_mib']})",
            share <= THIRD_OF_MEMORY,
        )
    )
    from_llama_cpp = (
        f"; from llama.cpp's {_parts(r['first_difference_llama_cpp'])}"
        if "first_difference_llama_cpp" in r
        else ""
    )
    text = (
        f"{title}{provenance(env)}\n"
        "Decode steps of the whole model (30 blocks and the head), each session past its "
        f"prompt, greedy, {r['steps']} steps a run, on {r['threads']} threads (ONNX "
        f"Runtime's spinning between runs, as a process alone runs it), {r['rounds']} "
        "rounds, half a second's pause before each run; in each round the batches first, "
        "then numpy's single session, then the engine's and llama.cpp's side by side, "
        f"which goes first alternating. {reference}Figures are medians over the rounds "
        "(ms a step / tokens/s, all sessions together).\n\n"
        + table(["", "1 session", f"{b} sessions"], rows)
        + "\n\nPer round, the engine: "
        f"{', '.join(num(x) for x in by_round['1'])} tokens/s for one session, "
        f"{', '.join(num(x) for x in by_round[str(b)])} for {b}; {b} over 1: "
        f"{', '.join(num(x, 2) for x in r['onnx_batch_over_single_by_round'])}. The engine "
        f"over numpy: {num(r['speedup_b1'], 2)}× at one session, "
        f"{num(r[f'speedup_b{b}'], 2)}× at {b}. Batching changed no session's tokens "
        "(checked: a session's tokens in the batch are its tokens alone). The engine's "
        f"text parts from numpy's {_parts(r['first_difference'])} (int8 activations "
        f"against float32: near-ties may flip){from_llama_cpp}"
        ".\n\nWhat a node holds (resident memory above the process's own, each range "
        "built in a fresh process, then 16 sessions of 30 positions run on it): the "
        f"whole model ({whole_key.split('_', 1)[1].replace('_', '–')}) {whole['built_mib']} "
        f"MiB built, {whole['sessions_mib']} with the sessions; its middle third "
        f"({third_key.split('_', 1)[1].replace('_', '–')}) {third['built_mib']} and "
        f"{third['sessions_mib']}: {num(share, 2)}× the whole.\n"
    )
    return text, targets


def _parts(step: int | None) -> str:
    """Where two greedy texts part: at a step, or never within those timed."""
    return "never within the steps timed" if step is None else f"at step {step}"


def section_long(env: Doc, img: str) -> tuple[str, list[Target]]:
    del img  # no picture
    r = env["report"]
    title = "## A long prompt through 3 stages: chunks run ahead, one a send, and numpy\n\n"
    if (absent := skipped(env, title)) is not None:
        return absent, []
    ttft = r["ttft_s"]
    arms = {
        "ahead": "the engine, the first stage running the chunks ahead (`hecate up`'s default)",
        "one_chunk": "the engine, one chunk a send (the router given `--no-run-ahead`)",
        "numpy": "the numpy model (`--executor smollm2-numpy`), one chunk a send",
    }
    rows = [[label, ", ".join(num(x, 2) for x in ttft[arm])] for arm, label in arms.items()]
    met, figure = judged(r["numpy_over_engine_by_round"], 1.0)
    ahead_met, ahead_figure = judged(r["one_chunk_over_ahead_by_round"], 1.0)
    ok = r["engine_text_ok"]
    stages = ", ".join(f"[{a}, {b})" for a, b in r["stages"])
    text = (
        f"{title}{provenance(env)}\n"
        f"A {num(r['prompt_tokens'], 0)}-token prompt (the long-prompt golden file's "
        f"last) to 3 chained stages ({stages}), one engine thread a node as `hecate up` "
        "runs them, on the swarm of the SmolLM2 section. The prompt runs in chunks whose "
        "activations fit the bus. With the chunks run ahead, the first stage runs every "
        "chunk itself and forwards each as soon as it is run, so that the stages after "
        "compute one chunk while it runs the next; one chunk a send, the router sends "
        "the next chunk once the one before has left the last stage (one stage computing "
        "at a time, as the swarm ran before). The arms take turns, the order rotated "
        "round by round; each swarm takes the prompt once to warm up, then once timed. "
        "Time to the first streamed token, per round (s):\n\n"
        + table(["nodes", "TTFT per round (s)"], rows)
        + "\n\nOne chunk a send over run ahead, per round: "
        f"{', '.join(num(x, 2) for x in r['one_chunk_over_ahead_by_round'])}; the numpy "
        "model's time over the engine's run ahead, per round: "
        f"{', '.join(num(x, 2) for x in r['numpy_over_engine_by_round'])}. The engine's "
        f"{r['tokens']} tokens, either way, are the single-process engine's greedy text: "
        + ("yes." if ok else "NO.")
        + " Three stages on two cores: at most two compute at once.\n"
    )
    return text, [
        Target(
            "a long prompt through 3 stages: prefill faster than the numpy model's "
            "(its time ÷ the engine's ≥ 1)",
            figure,
            met,
        ),
        Target(
            "a long prompt through 3 stages: chunks run ahead faster than one a send "
            "(one a send ÷ run ahead ≥ 1)",
            ahead_figure,
            ahead_met,
        ),
        Target(
            "a long prompt through 3 stages gives the single-process text",
            "equal" if ok else "differs",
            ok,
        ),
    ]
