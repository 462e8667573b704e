"""Wait policies (seed, full jitter, decorrelated jitter) and the non-blocking pause."""

from __future__ import annotations

import time

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hecate.resilience import POLICIES, DecorrelatedJitter, FullJitter, SeedPolicy
from hecate.resilience.aio import pause
from hecate.resilience.backoff import WaitPolicy

Policy = type[SeedPolicy] | type[FullJitter] | type[DecorrelatedJitter]
ALL: list[Policy] = [SeedPolicy, FullJitter, DecorrelatedJitter]
hint_values = st.one_of(st.none(), st.floats(min_value=0.0, max_value=3600.0))
attempts = st.integers(min_value=1, max_value=64)


def test_the_registry_names_each_policy() -> None:
    assert {"seed": SeedPolicy, "full": FullJitter, "decorrelated": DecorrelatedJitter} == POLICIES
    for name, cls in POLICIES.items():
        policy: WaitPolicy = cls(0)
        assert policy.name == name


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.name)
def test_a_policy_is_reproducible_with_a_seed(cls: Policy) -> None:
    def run(seed: int) -> list[float]:
        policy = cls(seed)
        return [policy.wait(a, h) for a in range(1, 8) for h in (None, 0.0, 2.5)]

    assert run(42) == run(42)
    assert run(42) != run(43)


# -- the seed's policy -----------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(), attempt=attempts, hint=st.floats(min_value=1e-6, max_value=3600.0))
def test_the_seed_policy_waits_the_hint_plus_point_one_to_point_five(
    seed: int, attempt: int, hint: float
) -> None:
    wait = SeedPolicy(seed).wait(attempt, hint)
    assert hint + 0.1 <= wait <= hint + 0.5


@pytest.mark.parametrize("hint", [None, 0.0, -1.0, -1e9], ids=str)
def test_the_seed_policy_defaults_to_one_second_without_a_usable_hint(
    hint: float | None,
) -> None:
    policy = SeedPolicy(7)
    for attempt in range(1, 50):
        assert 1.1 <= policy.wait(attempt, hint) <= 1.5


def test_the_seed_policys_default_and_jitter_are_configurable() -> None:
    policy = SeedPolicy(1, default_s=2.0, jitter=(0.0, 0.0))
    assert policy.wait(1, None) == 2.0
    assert policy.wait(1, 3.0) == 3.0


# -- full jitter -----------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(), attempt=attempts, hint=hint_values)
def test_full_jitter_waits_the_hint_plus_up_to_the_capped_exponential(
    seed: int, attempt: int, hint: float | None
) -> None:
    policy = FullJitter(seed, base_s=0.5, cap_s=30.0)
    h = hint or 0.0
    wait = policy.wait(attempt, hint)
    assert h <= wait <= h + min(30.0, 0.5 * 2**attempt)


def test_full_jitters_spread_doubles_until_the_cap() -> None:
    policy = FullJitter(3, base_s=1.0, cap_s=8.0)
    for attempt, spread in [(1, 2.0), (2, 4.0), (3, 8.0), (10, 8.0)]:
        waits = [policy.wait(attempt, None) for _ in range(2000)]
        assert max(waits) <= spread
        assert max(waits) > 0.9 * spread  # it does use the whole range


@pytest.mark.parametrize("attempt", [1_024, 1_100, 100_000], ids=str)
def test_full_jitter_survives_an_absurd_attempt_number(attempt: int) -> None:
    wait = FullJitter(1, base_s=0.5, cap_s=30.0).wait(attempt, 2.0)
    assert 2.0 <= wait <= 32.0


# -- decorrelated jitter ---------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(),
    hints=st.lists(st.tuples(st.integers(min_value=1, max_value=20), hint_values), max_size=30),
)
def test_decorrelated_jitter_waits_between_hint_plus_base_and_hint_plus_cap(
    seed: int, hints: list[tuple[int, float | None]]
) -> None:
    policy = DecorrelatedJitter(seed, base_s=0.5, cap_s=30.0)
    for attempt, hint in hints:
        h = hint or 0.0
        assert h + 0.5 <= policy.wait(attempt, hint) <= h + 30.0


def test_decorrelated_jitter_resets_on_attempt_one() -> None:
    policy = DecorrelatedJitter(5, base_s=0.5, cap_s=30.0)
    for attempt in range(2, 40):
        policy.wait(attempt, None)
    assert policy.previous > 1.5  # grown well past the first step's range
    for _ in range(200):
        assert 0.5 <= policy.wait(1, None) <= 1.5  # U(base, 3 * base)


def test_decorrelated_jitter_grows_from_the_previous_wait() -> None:
    policy = DecorrelatedJitter(11, base_s=0.5, cap_s=1e9)
    previous = policy.wait(1, None)
    for attempt in range(2, 30):
        wait = policy.wait(attempt, None)
        assert 0.5 <= wait <= 3 * previous
        previous = wait


# -- every policy ----------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(sorted(POLICIES)),
    seed=st.integers(),
    attempt=attempts,
    hint=st.floats(min_value=0.0, max_value=1e6),
)
def test_every_policy_waits_at_least_the_hint(
    name: str, seed: int, attempt: int, hint: float
) -> None:
    policy: WaitPolicy = POLICIES[name](seed)
    for a in range(1, attempt + 1):
        assert policy.wait(a, hint) >= hint


# -- the pause -------------------------------------------------------------------------


class Fixed:
    name = "fixed"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def wait(self, attempt: int, hint: float | None) -> float:
        del attempt, hint
        return self.seconds


async def test_pause_sleeps_without_blocking_the_event_loop() -> None:
    results: list[float] = []

    async def one() -> None:
        results.append(await pause(Fixed(0.2), 1, None))

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        tg.start_soon(one)
    elapsed = time.perf_counter() - start
    assert results == [0.2, 0.2]
    assert 0.2 <= elapsed < 0.35  # two 0.2 s pauses overlapped; blocking would take 0.4 s


async def test_pause_returns_the_seconds_the_policy_chose() -> None:
    policy = SeedPolicy(9, default_s=0.0, jitter=(0.01, 0.02))
    twin = SeedPolicy(9, default_s=0.0, jitter=(0.01, 0.02))
    seconds = await pause(policy, 1, None)
    assert seconds == twin.wait(1, None)
    assert 0.01 <= seconds <= 0.02


async def test_pause_never_sleeps_a_negative_time() -> None:
    start = time.perf_counter()
    assert await pause(Fixed(-5.0), 1, None) == 0.0
    assert time.perf_counter() - start < 0.1
