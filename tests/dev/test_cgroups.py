"""A memory cgroup holds a process to its limit: one that outgrows it is OOM-killed and
counted, one within it lives and its peak is read (cgroup v1, as root; skipped with the
reason elsewhere)."""

from __future__ import annotations

import os
import signal
import sys
import uuid

import pytest

from hecate_dev.cgroups import MemoryCgroup, available

MIB = 2**20
ABLE = available()
pytestmark = pytest.mark.skipif(not ABLE, reason=ABLE.reason or "cgroups available")

#: touches every page of ``N`` MiB (bytes filled, not zero pages left unmapped)
ALLOCATE = "import sys; held = b'x' * (int(sys.argv[1]) * 2**20); print(len(held))"


def _name() -> str:
    return f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def test_a_process_over_the_limit_is_oom_killed_and_counted() -> None:
    with MemoryCgroup(_name(), 200 * MIB) as group:
        done = group.run([sys.executable, "-c", ALLOCATE, "300"], capture_output=True)
        use = group.use()
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert use.oom_killed
    assert use.oom_kills >= 1
    assert use.limit == 200 * MIB
    assert use.max_usage <= 200 * MIB
    assert not group.path.exists()


def test_a_process_within_the_limit_lives_and_its_peak_is_read() -> None:
    with MemoryCgroup(_name(), 400 * MIB) as group:
        done = group.run([sys.executable, "-c", ALLOCATE, "300"], capture_output=True, text=True)
        use = group.use()
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(300 * MIB)
    assert not use.oom_killed
    assert 300 * MIB <= use.max_usage <= 400 * MIB
    assert not group.path.exists()


def test_what_is_left_in_the_group_is_killed_on_leaving() -> None:
    with MemoryCgroup(_name(), 100 * MIB) as group:
        child = group.popen(["sleep", "60"])
        assert group.pids()  # the sleep, once its shell has written its pid
    assert child.wait(timeout=10) == -signal.SIGKILL
    assert not group.path.exists()
