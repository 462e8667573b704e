"""The prefix-reuse section: chats resending a long system prompt and their history,
with the nodes' cached prefixes on and off (``hecate bench prefix``,
:mod:`hecate_dev.bench.prefix`)."""

# Prose for people: its dashes and multiplication signs are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from hecate_dev.bench.report.markdown import Doc, Met, Target, num, provenance, skipped, table

TARGET = 0.5  # TTFT p50 at the last turn with reuse, at most half of without


def section_prefix(env: Doc, img: str) -> tuple[str, list[Target]]:
    del img  # no picture
    r = env["report"]
    title = "## Chats that resend their prompt: prefix reuse on and off\n\n"
    if (absent := skipped(env, title)) is not None:
        return absent, []
    rows = []
    for i, rnd in enumerate(r["rounds"], 1):
        for arm in ("on", "off"):
            a = rnd[arm]
            rows.append(
                [
                    f"{i} {arm}",
                    ", ".join(num(x, 0) for x in a["ttft_p50_ms_by_turn"]),
                    num(a["prompt_tokens"], 0),
                    num(a["prefill_tokens_computed"], 0),
                    num(a["wall_s"], 1),
                    str(a["errors"]),
                ]
            )
    ratios = r["last_turn_ttft_ratios"]
    met: Met = {"met": True, "not met": False}.get(r["verdict"], "undecided")
    figure = ", ".join(num(x, 3) for x in ratios) + f" ({len(ratios)} rounds)"
    differ = sum(rnd["turns_that_differ"] for rnd in r["rounds"])
    text = (
        f"{title}{provenance(env)}\n"
        f"{r['users']} users chat at once through the gateway of `make run`'s swarm (two "
        "3-stage pipelines of SmolLM2, routers chaining the stages), each an official "
        f"`openai` client streaming {r['turns']} turns of `/v1/chat/completions` (greedy, "
        f"{r['max_tokens']} tokens a turn); every turn resends the same ~500-token system "
        "prompt, the user's earlier questions and answers, and a new question. The swarm "
        "is started afresh for each arm: as `hecate up` starts it (prefix reuse on), and "
        "with every router given `--no-prefix-cache` (off); the arms alternate which runs "
        "first. TTFT is the client's; prompt tokens are the gateway's usage; tokens "
        "computed are those less the positions the nodes took from cache (their STATS).\n\n"
        + table(
            ["round, reuse", "TTFT p50 by turn (ms)", "prompt tokens", "computed", "s", "errors"],
            rows,
        )
        + f"\n\nTTFT p50 at turn {r['turns']}, with ÷ without, per round: {figure}. "
        "Every answer with reuse was the answer without, turn by turn: "
        + ("yes." if not differ else f"NO ({differ} turns differ).")
        + "\n"
    )
    return text, [
        Target(f"TTFT p50 at turn {r['turns']} with prefix reuse ≤ {TARGET}× without", figure, met)
    ]
