"""``hecate bench ring``: what three stages on this machine's cores can reach with no bus
at all, against one process, in the same interleaved rounds.

Three processes, each holding a third of SmolLM2's blocks on the nodes' engine (the first
embeds, the last heads and picks the greedy token), pass each step along OS pipes in a
ring, as a chain of nodes would pass it over NATS; the driver hands the next token back
to the first. Nothing else runs: no bus, no router, no service shell. Beside it, one
process holds the whole model, on every core with threads spinning between runs, as
``hecate bench llm``'s single process. The configurations are:

- ``single``: the whole model in one process, 2 threads, spinning (the baseline);
- ``1 thread``: each stage on one thread that never spins (what ``hecate up`` gives a
  node, since a local swarm's stages share the cores);
- ``2 threads, spin in runs``: each stage on every core, its threads spinning within a
  run and stopping as it ends (ONNX Runtime's ``session.force_spinning_stop``): the
  fastest a stage can compute while the others wait, at one user.

One user: greedy generation of ``--tokens`` tokens from the prompt, decode tokens/s
after the first token. Many users: three groups of ``--batch`` sessions in flight at once
(so that the three stages compute together, as a pipeline under load does), each step
of a group one batched run on each stage; tokens/s over every session. Every generation's
tokens are checked against the single process's greedy tokens, and a configuration that
gives other tokens is reported as wrong, never as fast.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the engine loads in each stage's process, not in the driver's
    from hecate.llm.onnx_stage import Spin

MODEL = "smollm2-135m"
PROMPT = "The capital of France is"
#: name: (cuts of the 30 blocks, engine threads per stage, spin)
CONFIGS: dict[str, tuple[tuple[int, ...], int, Spin]] = {
    "single": ((0, 30), 2, True),
    "1 thread": ((0, 10, 20, 30), 1, False),
    "2 threads, spin in runs": ((0, 10, 20, 30), 2, "in runs"),
}
GROUPS = 3  # groups in flight in the many-users run: one per stage


def _stage(
    lo: int, hi: int, threads: int, spin: Spin, slots: int, rx: Connection, tx: Connection
) -> None:
    """One stage: each message is (group, per-session inputs); a session's cache is
    made at its group's first step. Token ids in on the first stage, greedy ids out on
    the last, hidden rows between."""
    from hecate.llm.onnx_stage import OnnxStage
    from hecate.llm.store import model_path

    stage = OnnxStage(model_path(MODEL), lo, hi, threads=threads, slots=slots, spin=spin)
    caches: dict[int, list[Any]] = {}
    while True:
        message = rx.recv()
        if message is None or isinstance(message, str):
            tx.send(message)
            if message is None:
                return
            continue
        group, inputs = message
        if group not in caches:
            caches[group] = [stage.new_cache() for _ in inputs]
        xs = [stage.embed(x) if stage.first else x for x in inputs]
        outs = stage.forward_batch(xs, caches[group])
        if stage.last:
            tx.send((group, [int(np.argmax(stage.logits_of([y])[0])) for y in outs]))
        else:
            tx.send((group, outs))


class Ring:
    """The stages of one configuration, each in a process of its own, in a ring."""

    def __init__(self, config: str, slots: int) -> None:
        cuts, threads, spin = CONFIGS[config]
        self.k = len(cuts) - 1
        pipes = [mp.Pipe(duplex=False) for _ in range(self.k + 1)]
        self.procs = [
            mp.Process(
                target=_stage,
                args=(cuts[i], cuts[i + 1], threads, spin, slots, pipes[i][0], pipes[i + 1][1]),
                daemon=True,
            )
            for i in range(self.k)
        ]
        for p in self.procs:
            p.start()
        self.send, self.recv = pipes[0][1], pipes[self.k][0]
        self.send.send("ready")  # passes each stage once it is built
        while self.recv.recv() != "ready":
            pass

    def close(self) -> None:
        self.send.send(None)
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()


def one_user(ring: Ring, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
    """Greedy ``tokens`` from ``prompt`` through ``ring``: decode tokens/s, and the ids."""
    ring.send.send((0, [prompt]))
    _, (token,) = ring.recv.recv()
    out, t0 = [token], time.perf_counter()
    for _ in range(tokens - 1):
        ring.send.send((0, [[token]]))
        _, (token,) = ring.recv.recv()
        out.append(token)
    return (tokens - 1) / (time.perf_counter() - t0), out


def many_users(
    ring: Ring, prompt: list[int], tokens: int, batch: int
) -> tuple[float, list[list[int]]]:
    """``GROUPS`` groups of ``batch`` sessions of ``prompt``, in flight together:
    tokens/s over every session's decode steps, and each session's ids."""
    out: dict[int, list[list[int]]] = {}
    for g in range(GROUPS):
        ring.send.send((g + 1, [prompt] * batch))
    for _ in range(GROUPS):
        g, ids = ring.recv.recv()
        out[g] = [[t] for t in ids]
    t0 = time.perf_counter()
    for g in out:
        ring.send.send((g, [[s[-1]] for s in out[g]]))
    steps = GROUPS * (tokens - 1)
    for _ in range(steps):
        g, ids = ring.recv.recv()
        for s, t in zip(out[g], ids, strict=True):
            s.append(t)
        if len(out[g][0]) < tokens:
            ring.send.send((g, [[s[-1]] for s in out[g]]))
    rate = steps * batch / (time.perf_counter() - t0)
    return rate, [s for g in sorted(out) for s in out[g]]


def run(rounds: int = 3, tokens: int = 48, batch: int = 8) -> dict[str, Any]:
    """Every configuration once a round, the order rotated from round to round."""
    from hecate.llm.store import model_path
    from hecate.llm.tokenizer import load_tokenizer

    mp.set_start_method("forkserver", force=True)
    prompt = load_tokenizer(model_path(MODEL)).encode(PROMPT).ids
    names = list(CONFIGS)
    one: dict[str, list[float]] = {n: [] for n in names}
    many: dict[str, list[float]] = {n: [] for n in names if n != "single"}
    truth: list[int] | None = None
    wrong: list[str] = []
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            ring = Ring(name, slots=GROUPS * batch + 1)
            try:
                rate, ids = one_user(ring, prompt, tokens)
                sessions: list[list[int]] = []
                if name in many:
                    many_rate, sessions = many_users(ring, prompt, tokens, batch)
                    many[name].append(round(many_rate, 1))
            finally:
                ring.close()
            if truth is None:
                truth = ids if name == "single" else None
            one[name].append(round(rate, 1))
            if truth is not None and any(s != truth for s in [ids, *sessions]):
                wrong.append(f"round {r + 1}: {name}")
            print(f"round {r + 1}: {name}: 1 user {rate:.1f} tokens/s", file=sys.stderr)
    return {
        "tokens": tokens,
        "batch": batch,
        "groups": GROUPS,
        "rounds": rounds,
        "configs": {
            n: {"cuts": c, "threads": t, "spin": str(sp)} for n, (c, t, sp) in CONFIGS.items()
        },
        "one_user_tokens_per_s": one,
        # Within each round, against that round's single process.
        "one_user_over_single": {
            n: [round(a / b, 3) for a, b in zip(one[n], one["single"], strict=True)]
            for n in names
            if n != "single"
        },
        "many_users_tokens_per_s": many,
        "wrong": wrong,
    }
