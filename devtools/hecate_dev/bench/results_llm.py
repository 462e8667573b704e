"""The SmolLM2 suite's figures as typed structs (``hecate bench llm``, many users at
once included; see :mod:`hecate_dev.bench.results` for how results are saved and read
back). A run that skipped itself (the model not pulled) or ran only the many-users part
(``--only-concurrency``) leaves the other parts out."""

from __future__ import annotations

from typing import Literal

import msgspec

from hecate_dev.bench.results import Result


class Generation(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One timed generation. ``text_ok``: its text (and, across stages, what it
    streamed) was the single-process greedy text (results saved before the check carry
    none); a wrong one keeps its text to be read."""

    ttft_ms: float
    tokens_per_s: float
    gap_ms: float | None = None  # median time between two tokens, across stages
    kill_stall_ms: float | None = None  # with a stage killed: the longest gap
    failover_reason: str | None = None
    # Across stages: tokens streamed and the seconds from the first to the last (what
    # pooled tokens/s add up; results saved before carry neither).
    tokens: int | None = None
    decode_s: float | None = None
    text_ok: bool | None = None
    matches_numpy_text: bool | None = None  # llama.cpp: compared, not checked
    text: str | None = None
    streamed_text: str | None = None

    @property
    def wrong(self) -> bool:
        return self.text_ok is False


class StageSteps(msgspec.Struct, frozen=True, kw_only=True):
    """One 10-block stage's decode step (median ms), back to back and after a pause."""

    busy_ms: float
    after_pause_ms: float


class LlamaCpp(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """llama.cpp's build and its median round, or why it did not run."""

    skipped: str | None = None
    version: str | None = None
    system_info: str = ""
    threads: int = 2
    ttft_ms: float | None = None
    tokens_per_s: float | None = None
    matches_numpy_text: bool | None = None


class Round(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One interleaved round of the headline runs. Results saved before the two buses
    were timed side by side (:class:`SecureRuns`) timed them here: the round's own pair
    in ``stages_3`` and ``stages_3_secure``, then its further pairs."""

    single: Generation | None = None
    single_1_thread: Generation | None = None  # older results: measured once, apart
    llama_cpp: Generation | None = None
    stages_3: Generation | None = None
    stages_3_secure: Generation | None = None  # older results: the locked-down bus
    secure_pairs: list[SecurePair] = []  # older results: the round's further pairs


class SecurePair(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The 3-stage swarm timed once on each bus, back to back; ``first``: which went
    first (``"open"`` or ``"secure"``; older results, where pairs sat in rounds, say
    none)."""

    first: str | None = None
    stages_3: Generation
    stages_3_secure: Generation


class SecureRuns(msgspec.Struct, frozen=True, kw_only=True):
    """The 3-stage swarm on the open bus and on the locked-down one, both standing at
    once, each warmed up with ``warmup`` generations, then timed in ``pairs``; pooled
    tokens/s of each side: its tokens after the first of every generation over the
    seconds between its first and last tokens, all pairs together."""

    warmup: int
    pairs: list[SecurePair]
    pooled_open_tokens_per_s: float
    pooled_secure_tokens_per_s: float


class LlmMeta(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    tokens: int
    # A --only-concurrency run may leave these out: the suite's defaults.
    node_blas_threads: int = 2
    rounds: int = 3
    prompt: str = ""
    greedy: bool = True
    python: str = ""
    machine: str = ""
    date: str = ""
    text: str = ""  # the single-process greedy text every run is checked against
    only_concurrency: bool = False


# -- many users at once ------------------------------------------------------------------


class Level(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One level (users at once) in one round, or over the rounds (counts summed, each
    figure the median round's, ``rounds`` how many)."""

    sent: int
    answered: int
    errors: int
    errors_by_code: dict[str, int]  # always written: the verdicts read it from the rounds
    lost: int
    resent: int = 0
    wrong: int
    tokens: int
    wall_s: float | None = None
    aggregate_tokens_per_s: float | None
    per_user_tokens_per_s: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    rounds: int | None = None


class OneProcess(msgspec.Struct, frozen=True, kw_only=True):
    """The round's baseline: one process batching ``sessions`` sessions
    (:func:`hecate_dev.bench.llm_single.batched`); ``wrong``: its texts that were not their
    prompts' single-user greedy texts."""

    sessions: int
    tokens: int
    ttft_ms: float
    aggregate_tokens_per_s: float
    wrong: int


class UsersRound(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    order: list[int] = []
    levels: dict[str, Level]  # by users at once, as a string
    one_process: OneProcess | None = None  # results saved before it was measured: none
    # By level: ms of CPU per answered token, by part of the swarm and for the users'
    # clients (llm_concurrency.cpu_per_token); results saved before: none.
    cpu: dict[str, dict[str, float]] = {}


class UsersMeta(msgspec.Struct, frozen=True, kw_only=True):
    levels: list[int]
    tokens: int
    rounds: int
    prompts: int
    reference: str
    deadline_s: dict[str, float]
    swarm: str
    warmed_pipelines: list[str] = []
    # How the users reached the swarm; results saved before the gateway carried them:
    # a HecateClient each, over NATS.
    via: str = "a HecateClient each, streaming on its request's inbox over NATS"
    one_process: str = ""  # the baseline, in words; none before it was measured


class Users(msgspec.Struct, frozen=True, kw_only=True):
    """Many users at once: every level over the rounds, the verdicts as the suite gave
    them (the report judges the saved rounds again), and every round."""

    levels: dict[str, Level]
    verdicts: dict[str, dict[str, object]] = {}
    failed_checks: list[str] = []
    rounds: list[UsersRound]
    meta: UsersMeta


# -- the suite ---------------------------------------------------------------------------


class LlmResult(Result, frozen=True, kw_only=True, omit_defaults=True):
    skipped: str | None = None  # the model is not pulled
    single: Generation | None = None
    stages_3: Generation | None = None
    ratio_3_stages_rounds: list[float] | None = None
    # 3 stages over the engine on one thread (a stage's), per round; older results: none.
    ratio_3_stages_1_thread_rounds: list[float] | None = None
    # The 3-stage swarm on the bus as deployed (TLS, an account per tenant, a user per
    # process, the tenant vouched by the server): its median pair's run (older results:
    # its median round's), its tokens/s over the open bus's in each pair and the median,
    # that judged as the suite judged it (met, not met, or None unmeasured; the report
    # judges the pairs again), the pooled tokens/s over the open bus's, and every pair.
    stages_3_secure: Generation | None = None
    secure_over_open_rounds: list[float] | None = None
    secure_over_open: float | None = None
    secure_over_open_met: bool | Literal["undecided"] | None = None
    secure_over_open_pooled: float | None = None
    secure_runs: SecureRuns | None = None
    single_1_thread: Generation | None = None
    stages_1: Generation | None = None
    stages_2: Generation | None = None
    stages_3_hop: Generation | None = None
    stages_3_1_thread: Generation | None = None
    stage_steps_1_thread: StageSteps | None = None
    stage_steps_2_threads: StageSteps | None = None
    kill_between_steps: Generation | None = None
    kill_mid_step: Generation | None = None
    llama_cpp: LlamaCpp | None = None
    ratio_single_llama_cpp_rounds: list[float] | None = None
    ratio_single_llama_cpp: float | None = None
    ratio_3_stages: float | None = None
    ratio_3_stages_1_thread: float | None = None
    rounds: list[Round] | None = None
    failed_checks: list[str] | None = None  # None: saved before texts were checked
    meta: LlmMeta | None = None
    concurrency: Users | None = None
