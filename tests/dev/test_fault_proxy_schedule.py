"""The fault proxy's schedule: when bytes read at a given moment may go out, with no
socket and no clock (hecate_dev.chaos.toxics)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate_dev.chaos.toxics import LinkSchedule, Release, Toxics, segment_bytes

# Chunks as a proxy reads them: (seconds since the previous read, bytes read).
chunks = st.lists(st.tuples(st.floats(0.0, 0.05), st.integers(1, 20_000)), min_size=1, max_size=60)
toxics = st.builds(
    Toxics,
    latency_s=st.floats(0.0, 0.2),
    jitter_s=st.floats(0.0, 0.1),
    bandwidth=st.none() | st.floats(1_000.0, 5e7),
)


def run(
    schedule: LinkSchedule, reads: list[tuple[float, int]]
) -> list[tuple[float, int, list[Release]]]:
    """Each read's time, size and releases."""
    now, out = 0.0, []
    for gap, size in reads:
        now += gap
        out.append((now, size, schedule.release(now, size)))
    return out


@given(toxics, chunks, st.integers(0, 2**32))
def test_bytes_go_out_in_the_order_they_came_and_all_of_them(
    t: Toxics, reads: list[tuple[float, int]], seed: int
) -> None:
    released = run(LinkSchedule(t, random.Random(seed)), reads)
    times = [r.at for _, _, rs in released for r in rs]
    assert times == sorted(times)
    for _, size, rs in released:
        assert sum(r.size for r in rs) == size


@given(toxics, chunks, st.integers(0, 2**32))
def test_no_byte_leaves_before_the_latency(
    t: Toxics, reads: list[tuple[float, int]], seed: int
) -> None:
    for now, _, rs in run(LinkSchedule(t, random.Random(seed)), reads):
        assert all(r.at >= now + t.latency_s for r in rs)


@given(st.floats(0.0, 0.2), st.floats(0.0, 0.1), chunks, st.integers(0, 2**32))
def test_jitter_stays_within_its_bounds_even_when_order_holds_a_chunk_back(
    latency: float, jitter: float, reads: list[tuple[float, int]], seed: int
) -> None:
    schedule = LinkSchedule(Toxics(latency, jitter), random.Random(seed))
    for now, _, rs in run(schedule, reads):
        (r,) = rs
        assert now + latency <= r.at <= now + latency + jitter + 1e-9


@given(st.floats(10_000.0, 5e7), st.floats(0.0, 0.1), chunks, st.integers(0, 2**32))
def test_bandwidth_is_never_exceeded_over_any_window(
    bandwidth: float, jitter: float, reads: list[tuple[float, int]], seed: int
) -> None:
    """Over any window [t1, t2] at most bandwidth * (t2 - t1) bytes, plus the one
    segment whose sending began before the window, are released."""
    schedule = LinkSchedule(Toxics(0.01, jitter, bandwidth), random.Random(seed))
    out = [r for _, _, rs in run(schedule, reads) for r in rs]
    seg = segment_bytes(bandwidth)
    assert all(r.size <= seg for r in out)
    # The worst window ending at each release, in one pass: bytes(i..j) - bw * (t_j - t_i)
    # = (S_j - bw t_j) - (S_{i-1} - bw t_i), so keep the least second term seen so far.
    before, least = 0, float("inf")
    for r in out:
        least = min(least, before - bandwidth * r.at)
        before += r.size
        assert (before - bandwidth * r.at) - least <= seg * (1 + 1e-9) + 1e-6 * before


@given(st.lists(toxics, min_size=2, max_size=6), chunks, st.integers(0, 2**32))
def test_order_holds_when_the_toxics_change_between_reads(
    changes: list[Toxics], reads: list[tuple[float, int]], seed: int
) -> None:
    schedule = LinkSchedule(rng=random.Random(seed))
    now, times = 0.0, []
    for i, (gap, size) in enumerate(reads):
        schedule.toxics = changes[i % len(changes)]
        now += gap
        times += [r.at for r in schedule.release(now, size)]
    assert times == sorted(times)


def test_a_clean_link_passes_bytes_at_once_in_one_piece() -> None:
    assert LinkSchedule().release(3.0, 100) == [Release(3.0, 100)]


def test_a_narrow_link_takes_size_over_bandwidth() -> None:
    schedule = LinkSchedule(Toxics(bandwidth=1000.0))
    out = schedule.release(0.0, 100)
    assert out[-1].at == pytest.approx(0.1)
    assert schedule.release(0.0, 100)[-1].at == pytest.approx(0.2)  # it waits its turn


def test_negative_figures_are_refused() -> None:
    with pytest.raises(ValueError, match="never negative"):
        Toxics(latency_s=-1.0)
    with pytest.raises(ValueError, match="positive"):
        Toxics(bandwidth=0.0)
