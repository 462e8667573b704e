"""The SmolLM2 section: one process and across the swarm, and many users at once
(``hecate bench llm``)."""

# Prose for people: its dashes and multiplication signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

import re
from typing import TypeVar

from hecate_dev.bench.report import concurrency as users
from hecate_dev.bench.report.markdown import (
    Doc,
    Met,
    Target,
    num,
    provenance,
    span,
    table,
    verdict,
)
from hecate_dev.bench.report.paired import WRONG, judged, wrong
from hecate_dev.bench.report.secure import SECURE_TARGET, judge_secure, secure_prose
from hecate_dev.bench.results import load
from hecate_dev.bench.results_llm import Generation, LlamaCpp, LlmResult, Round

LLM_TARGET_STAGES = 0.9  # 3 stages / single process, tokens/s (each kind of single)
STAGES_EVERY_CORE = f"3 stages ≥ {LLM_TARGET_STAGES}× single process, every core (tokens/s)"
STAGES_ONE_THREAD = (
    f"3 stages ≥ {LLM_TARGET_STAGES}× single process on a stage's one thread (tokens/s)"
)
LLM_TARGET_LLAMA = 1.0  # single process (the engine) / llama.cpp, tokens/s
LLM_TARGET_STALL_MS = 1500.0  # longest gap in a stream when a stage is killed


T = TypeVar("T")


def _need(value: T | None, name: str) -> T:
    """A figure every full run saves (one with its rounds: not skipped, not
    ``--only-concurrency``)."""
    if value is None:
        raise ValueError(f"the llm result has its rounds but no {name}")
    return value


def _speed(run: Generation | LlamaCpp | None) -> str:
    if run is None or run.ttft_ms is None or run.tokens_per_s is None:
        return "not measured"
    if isinstance(run, Generation) and run.wrong:
        return WRONG
    return f"{num(run.ttft_ms, 1)} / {num(run.tokens_per_s, 1)}"


def _in_rounds(r: LlmResult, name: str) -> list[Generation | None]:
    """Every round's run of ``name`` (the median one alone in older results)."""
    rounds = r.rounds or [Round(single=r.single, stages_3=r.stages_3)]
    runs: list[Generation | None] = [getattr(rnd, name) for rnd in rounds]
    return runs


def _llama(r: LlmResult) -> tuple[LlamaCpp | None, str]:
    """llama.cpp's median run, or None and why it was not run."""
    llama = r.llama_cpp
    if llama is None:
        return None, "llama-cpp-python not installed"
    if llama.skipped is not None:
        return None, llama.skipped
    return llama, ""


def _built_with(llama: LlamaCpp) -> str:
    """The features llama.cpp was compiled with, from its system info."""
    enabled = re.findall(r"([A-Z][A-Z0-9_]*) = 1", llama.system_info)
    return ", ".join(dict.fromkeys(enabled)) or "not recorded"


def _users(r: LlmResult, img: str) -> tuple[str, list[Target]]:
    """The many-users part, or why it is not in this result."""
    if r.concurrency is None:
        return "", users.not_run("not run (a result saved before it existed)")
    text, targets = users.section(r.concurrency, img)
    return f"\n{text}", targets


def _text_check(r: LlmResult) -> tuple[str, bool | None]:
    failed = r.failed_checks
    if failed is None:
        return "not checked in this run", None
    return ("; ".join(failed) if failed else "all equal"), not failed


def section_llm(env: Doc, img: str) -> tuple[str, list[Target]]:
    r = load(env["report"], LlmResult)
    title = "## SmolLM2-135M: one process and across the swarm\n\n"
    single_user_not_run = [
        Target(STAGES_EVERY_CORE, "not run", None),
        Target(STAGES_ONE_THREAD, "not run", None),
        Target(f"single process ≥ {LLM_TARGET_LLAMA}× llama.cpp", "not run", None),
        Target("a kill stalls the stream < 1.5 s", "not run", None),
        Target(SECURE_TARGET, "not run", None),
    ]
    if r.skipped is not None:
        text = f"{title}{provenance(env)}\nNot measured in this run: {r.skipped}.\n"
        return text, [*single_user_not_run, *users.not_run()]
    if r.ratio_3_stages_rounds is None:  # --only-concurrency
        text_figure, met_text = _text_check(r)
        part, targets = _users(r, img)
        text = (
            f"{title}{provenance(env)}\nOnly the many-users part ran "
            f"(`--only-concurrency`); every answer's text against its single-user greedy "
            f"text: {text_figure}.\n{part}"
        )
        every = Target(
            "every timed generation gives the single-process text", text_figure, met_text
        )
        return text, [every, *single_user_not_run, *targets]
    meta = _need(r.meta, "meta")
    ratio = _need(r.ratio_3_stages, "ratio_3_stages")
    kill_between = _need(r.kill_between_steps, "kill_between_steps")
    kill_mid = _need(r.kill_mid_step, "kill_mid_step")
    steps_node = r.stage_steps_1_thread  # what hecate up gives a node
    rounds = r.ratio_3_stages_rounds
    one_rounds = r.ratio_3_stages_1_thread_rounds or []
    llama, why_not = _llama(r)
    kills = [kill_between, kill_mid]
    llama_rounds = r.ratio_single_llama_cpp_rounds
    ratio_llama = r.ratio_single_llama_cpp
    wrong_single = any(wrong(x) for x in _in_rounds(r, "single"))
    rows = [
        ["single process, the engine, every core (spinning threads)", _speed(r.single)],
        ["single process, the engine, 1 thread", _speed(r.single_1_thread)],
        [
            f"llama.cpp {llama.version}, {llama.threads} threads (median round)"
            if llama and llama.version is not None
            else "llama.cpp, 2 threads",
            _speed(llama) if llama else f"skipped: {why_not}",
        ],
        ["1 stage over NATS", _speed(r.stages_1)],
        ["2 stages", _speed(r.stages_2)],
        ["3 stages, chained (median round)", _speed(r.stages_3)],
        [
            "3 stages, chained, locked-down bus (median "
            f"{'round' if r.secure_runs is None else 'pair'})",
            _speed(r.stages_3_secure),
        ],
        ["3 stages, router calls each stage (hop)", _speed(r.stages_3_hop)],
        ["**3 stages ÷ single process**, per round", ", ".join(num(x, 3) for x in rounds)],
        ["3 stages ÷ single process, median round", f"**{num(ratio, 3)}**"],
        [
            "**3 stages ÷ single process on 1 thread**, per round",
            ", ".join(num(x, 3) for x in one_rounds) if one_rounds else "–",
        ],
        [
            "3 stages, locked-down ÷ open bus, per pair",
            ", ".join(num(x, 3) for x in r.secure_over_open_rounds or []) or "–",
        ],
        [
            "3 stages, locked-down ÷ open bus, pooled tokens/s",
            num(r.secure_over_open_pooled, 3) if r.secure_over_open_pooled is not None else "–",
        ],
        [
            "single process ÷ llama.cpp, per round",
            ", ".join(num(x, 3) for x in llama_rounds) if llama_rounds else "–",
        ],
        [
            "single process ÷ llama.cpp, median round (range)",
            f"{num(ratio_llama, 3)} ({span(llama_rounds, 3)})"
            if llama_rounds and ratio_llama is not None
            else num(ratio_llama, 2)
            if ratio_llama is not None
            else "–",
        ],
        [
            "kill as a token arrives: longest gap (ms), how the router heard",
            WRONG if wrong(kills[0]) else _stall(kills[0]),
        ],
        [
            "kill ~40 % into the next step: longest gap (ms), how",
            WRONG if wrong(kills[1]) else _stall(kills[1]),
        ],
    ]
    figures = table(["figure (TTFT ms / tokens/s unless stated)", "this run"], rows)
    steps = {
        "1 thread (what `hecate up` gives a node)": r.stage_steps_1_thread,
        "2 threads, not spinning between runs": r.stage_steps_2_threads,
    }
    step_table = table(
        ["engine threads", "back to back (ms)", "after a 25 ms pause (ms)"],
        [
            [k, num(v.busy_ms, 2), num(v.after_pause_ms, 2)]
            for k, v in steps.items()
            if v is not None
        ],
    )
    wrong_stages = wrong_single or any(wrong(x) for x in _in_rounds(r, "stages_3"))
    met_stages, stages_figure = judged(rounds, LLM_TARGET_STAGES) if rounds else (None, "–")
    if wrong_stages:
        met_stages, stages_figure = False, WRONG
    above = sum(1 for x in rounds if x >= LLM_TARGET_STAGES)
    met_one, one_figure = (
        judged(one_rounds, LLM_TARGET_STAGES)
        if one_rounds
        else (None, "not measured in this run (a result saved before it was)")
    )
    if wrong_stages or any(wrong(x) for x in _in_rounds(r, "single_1_thread")):
        met_one, one_figure = False, WRONG
    met_llama: Met = None
    llama_figure = why_not
    if ratio_llama is not None:
        met_llama, llama_figure = (
            judged(llama_rounds, LLM_TARGET_LLAMA)
            if llama_rounds
            else (ratio_llama >= LLM_TARGET_LLAMA, f"{num(ratio_llama, 2)}×")
        )
        if wrong_single:
            met_llama, llama_figure = False, WRONG
    stall = max(k.kill_stall_ms or 0.0 for k in kills)
    wrong_kill = any(wrong(k) for k in kills)
    met_stall = stall < LLM_TARGET_STALL_MS and not wrong_kill
    stall_figure = WRONG if wrong_kill else f"{num(stall / 1000, 2)} s"
    text_figure, met_text = _text_check(r)
    met_secure, secure_figure = judge_secure(r)
    n = meta.rounds
    rounds_text = "one round" if n == 1 else f"{n} interleaved rounds"
    text = f"""{title}{provenance(env)}
Greedy, prompt "{meta.prompt}", {meta.tokens} tokens; the fields are explained at
the top of `devtools/hecate_dev/bench/llm.py`. Separate processes on one embedded
nats-server: a telemetry service, a router (`--dispatch chain` unless noted) and 1-3
nodes (`--executor smollm2`: the engine, ONNX Runtime on the GGUF's own blocks), the
plan written to KV; nodes run the engine on {meta.node_blas_threads} thread{
        "" if meta.node_blas_threads == 1 else "s"
    } each (`HECATE_ENGINE_THREADS`), threads that do not spin between runs, as `hecate up`
runs them. The headline ratios are measured in {rounds_text} (single,
llama.cpp when installed, 3 stages, single, ...) and the median round is reported: this
machine's speed drifts over minutes, and a ratio within one round cancels most of it.
{_llama_prose(r, llama, why_not)}

Every timed generation, the kills included, is checked against the single-process
greedy text: {text_figure}.

{figures}

One 10-block stage's decode step (median ms), back to back and after a 25 ms pause
(what a stage sees: the other stages' share of a token):

{step_table}

Against the issue's targets:

* **every timed generation gives the single-process text**: {verdict(met_text)}
  ({text_figure}). A run with the wrong text is reported as failed, never as fast.
* **{STAGES_EVERY_CORE}**: {verdict(met_stages)}
  ({stages_figure}; {above} of {len(rounds)} rounds at or above it{
        "; a round produced the wrong text" if wrong_stages else ""
    }). What the gap
  is made of: the bus, the router and the nodes' own work take about a quarter of one
  user's token (the section "Where a token's time goes" splits it along every process's
  spans); each stage pays a wake-up after idling while the others
  compute (the pause column above{
        f": on one thread, {num(steps_node.after_pause_ms, 2)} ms after a pause against "
        f"{num(steps_node.busy_ms, 2)} ms back to back"
        if steps_node is not None
        else ""
    }); every step runs on the node's compute thread, never on its event loop, so that
  heartbeats and the bus keep flowing however busy the node is; and the single process
  lets its threads spin between runs, which stages sharing two cores cannot afford.
  Stages on separate machines would not share cores and could spin freely; that is not
  measured here. As `hecate up` runs them, one user's stages compute one after another,
  each on the one thread it gives a node, so their compute alone takes about as long as
  the single process's on one thread; stages that spin only within their runs come
  nearer with no bus at all, and lose the most when the stages compute together (the
  section "Three stages with no bus").
* **{STAGES_ONE_THREAD}**: {verdict(met_one)} ({one_figure}). The same
  chain against one process computing each step on the same one thread: what the
  chain itself costs one user (the bus's four hops, the nodes' decoding, encoding and
  handoffs to their compute thread), the compute being alike on both sides.
* **single process ≥ {LLM_TARGET_LLAMA}× llama.cpp**: {verdict(met_llama)}
  ({llama_figure}). Both read the file's quantised blocks once per token and multiply
  with 8-bit activations; what is left between them is kernels and the per-step
  overhead of a graph run.
* **a kill stalls the stream < {num(LLM_TARGET_STALL_MS / 1000, 1)} s**:
  {verdict(met_stall)} (longest gap {num(stall / 1000, 2)} s{
        "; a killed run produced the wrong text" if wrong_kill else ""
    }). Killed between steps,
  the next step's forward finds no subscriber and the node before it relays NATS'
  no-responders; killed in the middle of a step, the request dies with the node and the
  router hears of it through telemetry's node-down, then replays the prompt and the
  tokens so far. Whether the "as a token arrives" kill finds the node idle depends on
  timing; the reported reason says which path was taken.
{secure_prose(r, met_secure, secure_figure)}
"""
    part, many = _users(r, img)
    return text + part, [
        Target("every timed generation gives the single-process text", text_figure, met_text),
        Target(STAGES_EVERY_CORE, stages_figure, met_stages),
        Target(STAGES_ONE_THREAD, one_figure, met_one),
        Target(f"single process ≥ {LLM_TARGET_LLAMA}× llama.cpp", llama_figure, met_llama),
        Target("a kill stalls the stream < 1.5 s", stall_figure, met_stall),
        Target(SECURE_TARGET, secure_figure, met_secure),
        *many,
    ]


def _stall(kill: Generation) -> str:
    return f"{num(kill.kill_stall_ms or 0.0, 1)}, {kill.failover_reason}"


def _llama_prose(r: LlmResult, llama: LlamaCpp | None, why_not: str) -> str:
    if llama is None:
        return (
            f"llama.cpp reference: skipped ({why_not}), so no verdict against it. "
            "`pip install './devtools[bench]'` installs the pinned llama-cpp-python, built "
            "from PyPI's source with this machine's compiler."
        )
    if llama.version is None:  # saved before its build was recorded
        return "llama.cpp: llama-cpp-python, 2 threads, the same GGUF."
    rounds = r.ratio_single_llama_cpp_rounds or []
    same = llama.matches_numpy_text
    text = ""
    if same is not None:
        text = (
            " Its greedy text is the engine's."
            if same
            else " Its greedy text differs from the engine's (their kernels differ, so "
            "near-ties may flip)."
        )
    return (
        f"llama.cpp reference: llama-cpp-python {llama.version} (`pip install "
        f"'./devtools[bench]'`, built from PyPI's source with this machine's compiler; its "
        f"llama.cpp was built with {_built_with(llama)}), {llama.threads} threads, the "
        "same GGUF and prompt token ids, greedy for the same number of tokens, timed in "
        f"the same {len(rounds)} rounds as the single process (single, llama.cpp, 3 "
        f"stages, ...), the ratio taken per round.{text}"
    )
