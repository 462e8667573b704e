"""The swarm and the load a chaos scenario runs with."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from importlib import resources

from hecate_dev.bench.concurrency import PROMPTS
from hecate_dev.chaos.load import prompt, prompts

MODEL = "ncm-base"
LLM = "smollm2-135m"


def topology(name: str) -> bytes:
    """A topology the scenarios run (``topologies/NAME``): package data, so that an
    installed hecate runs its scenarios without a source checkout."""
    return (resources.files("hecate_dev.chaos") / "topologies" / name).read_bytes()


@dataclass(frozen=True)
class Setup:
    """The swarm and the load a scenario runs with (``topology``: a file of
    ``topologies/``)."""

    topology: str = "chaos.json"
    dispatch: str = "hop"
    max_tokens: int = 6
    workers: int = 4
    timeout_s: float = 2.0
    cluster: int = 1
    stream: bool = False  # callers stream their tokens (their arrival times are kept)
    prompt_set: tuple[str, ...] = ()  # worker w's i-th prompt: [(w + i) % workers]
    short_workers: int | None = None  # with --short, when it differs
    short_max_tokens: int | None = None
    # The processes started behind a fault proxy of their own (labels or fnmatch
    # patterns, as Swarm(proxied=...) takes them): "node-*" for a scenario that picks
    # its victim only once the load runs.
    proxied: tuple[str, ...] = ()

    def of(self, short: bool) -> Setup:
        """The setup a run uses (``short``: the tests' size, where it differs)."""
        if not short:
            return self
        return dataclasses.replace(
            self,
            workers=self.short_workers or self.workers,
            max_tokens=self.short_max_tokens or self.max_tokens,
        )

    def prompt(self, worker: int, i: int) -> str:
        if not self.prompt_set:
            return prompt(worker, i)
        return self.prompt_set[(worker + i) % min(self.workers, len(self.prompt_set))]

    def prompts(self) -> list[str]:
        """Every prompt the load sends."""
        if not self.prompt_set:
            return prompts(self.workers)
        return sorted(set(self.prompt_set[: self.workers]))


LLM_SETUP = Setup(
    topology="smollm2.json", dispatch="chain", max_tokens=16, workers=2, timeout_s=20.0
)
# Sixteen users at once: a generation can take minutes on two cores when they all wait
# their turn, and silence until then is what "lost" must mean.
LLM_OVERLOAD_SETUP = Setup(
    topology="smollm2.json",
    dispatch="chain",
    max_tokens=32,
    workers=16,
    timeout_s=240.0,
    stream=True,
    prompt_set=PROMPTS,
    short_workers=8,
    short_max_tokens=16,
)
