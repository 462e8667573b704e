"""The stage-ring section: three stages passing each step over OS pipes, no bus, against
one process in the same rounds (``hecate bench ring``, :mod:`hecate_dev.bench.stage_ring`):
the most that stages sharing this machine's cores can reach."""

# ruff: noqa: RUF001

from __future__ import annotations

import statistics

from hecate_dev.bench.report.markdown import Doc, Target, num, provenance, skipped, table
from hecate_dev.bench.report.paired import judged

TARGET = 0.9
LABELS = {
    "single": "one process, the whole model, 2 threads spinning",
    "1 thread": "3 stages, 1 thread each, never spinning (as `hecate up` runs nodes)",
    "2 threads, spin in runs": "3 stages, 2 threads each, spinning only within a run",
}


def section_ring(env: Doc, img: str) -> tuple[str, list[Target]]:
    del img  # no picture
    r = env["report"]
    title = "## Three stages with no bus: what this machine's cores allow\n\n"
    if (absent := skipped(env, title)) is not None:
        return absent, []
    one, over, many = (
        r["one_user_tokens_per_s"],
        r["one_user_over_single"],
        r["many_users_tokens_per_s"],
    )
    in_flight = f"{r['groups']} × {r['batch']} sessions in flight"
    rows = []
    for name, label in LABELS.items():
        rows.append(
            [
                label,
                ", ".join(num(x, 1) for x in one[name]),
                ", ".join(num(x, 3) for x in over[name]) if name in over else "1",
                ", ".join(num(x, 1) for x in many[name]) if name in many else "not run",
            ]
        )
    body = table(
        ["per round", "1 user: tokens/s", "1 user ÷ one process", f"{in_flight}: tokens/s"],
        rows,
    )
    targets = []
    for name in over:
        met, figure = judged(over[name], TARGET)
        targets.append(
            Target(f"3 stages with no bus ({name}) ≥ {TARGET}× one process, 1 user", figure, met)
        )
    wrong = r["wrong"]
    text = (
        f"{title}{provenance(env)}\n"
        "Three processes, each holding 10 of SmolLM2's 30 blocks on the nodes' engine (the "
        "first embeds, the last heads and picks the greedy token), pass each step along OS "
        "pipes in a ring, as a chain of nodes passes it over NATS; nothing else runs (no "
        "bus, no router, no service shell). Beside them, in the same rounds, one process "
        "holds the whole model. One user: greedy generation of "
        f"{r['tokens']} tokens, decode tokens/s after the first. Many users: {in_flight} "
        "(a group per stage, so that the three compute at once, as a loaded pipeline "
        f"does), each step of a group one batched run on each stage. {r['rounds']} rounds, "
        "the order rotated from round to round; ratios within a round.\n\n"
        f"{body}\n\n"
        "Every generation's tokens, one user's and every session's: "
        + (
            "all equal to the single process's greedy tokens."
            if not wrong
            else f"WRONG in {wrong}."
        )
        + "\n\nWhat it says: three stages sharing two cores compute one after another for "
        "one user, so their best is one process's compute plus what handing a step over "
        "costs, and the bus, the router and the nodes' service shells only add to what "
        f"this ring pays. Stages that spin within their runs {_spinning(over, many)}, "
        "which is why `hecate up` gives each node one thread. Stages on machines of their "
        "own would not share cores; this machine cannot show that.\n"
    )
    return text, targets


def _spinning(over: dict[str, list[float]], many: dict[str, list[float]]) -> str:
    """What spinning within runs did against one thread, from this run's medians."""
    spin, one = "2 threads, spin in runs", "1 thread"
    if spin not in over or one not in over:
        return "were not measured"
    a, b = statistics.median(over[spin]), statistics.median(over[one])
    at_one = (
        f"come nearer at one user (median {num(a, 3)} against {num(b, 3)})"
        if a > b
        else f"come no nearer at one user in this run (median {num(a, 3)} against {num(b, 3)})"
    )
    if spin not in many or one not in many:
        return at_one
    x, y = statistics.median(many[spin]), statistics.median(many[one])
    figures = f"{num(x, 1)} tokens/s against {num(y, 1)}"
    if x < y:
        why = "their spinning threads take the cores the others compute on"
        return f"{at_one}, and lose when the stages compute at once ({figures}: {why})"
    return f"{at_one}, and do not lose when the stages compute at once ({figures})"
