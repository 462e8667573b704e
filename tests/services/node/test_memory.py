"""A node's memory as Linux says it (hecate_node.memory): sizes as operators type them,
cgroup v1 and v2 as /proc/self/cgroup names them, their "no limit", /proc's figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from hecate_node.memory import available, cgroup_dir, limit_of, parse_size, read, resident


@pytest.mark.parametrize(
    ("text", "size"),
    [("2G", 2 << 30), ("1536M", 1536 << 20), ("1.5GiB", 3 << 29), ("4096", 4096), ("64k", 65536)],
)
def test_sizes_as_operators_type_them(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-1G", "0", "2P", "3e9", "2 G B"])
def test_a_size_that_is_not_one_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="expected a size"):
        parse_size(text)


def test_cgroup_v1_memory_is_found_among_its_controllers() -> None:
    text = "12:pids:/x\n4:cpu,memory:/hecate-node-a\n0::/init.scope\n"
    assert cgroup_dir(text, Path("/cg")) == Path("/cg/memory/hecate-node-a")


def test_cgroup_v2_is_the_unified_line() -> None:
    assert cgroup_dir("0::/system.slice/hecate.service\n", Path("/cg")) == Path(
        "/cg/system.slice/hecate.service"
    )
    assert cgroup_dir("", Path("/cg")) is None


def test_no_limit_reads_as_none() -> None:
    assert limit_of("max\n") is None
    assert limit_of("9223372036854771712\n") is None  # v1's "unlimited"
    assert limit_of("2147483648\n") == 2 << 30


def test_proc_figures() -> None:
    assert available("MemTotal: 100 kB\nMemAvailable:   2048 kB\n") == 2 << 20
    assert resident("Name: x\nVmRSS:\t  1024 kB\n") == 1 << 20
    with pytest.raises(ValueError, match="MemAvailable"):
        available("MemTotal: 1 kB\n")


def test_the_flag_wins_and_otherwise_linux_says() -> None:
    assert read(3 << 30).limit == 3 << 30
    assert read(3 << 30).source == "flag"
    found = read(None)
    assert found.source in ("cgroup", "free")
    assert found.limit > 0
