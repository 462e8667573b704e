"""The product wheel ships the product only: the benchmarks and chaos scenarios are the
dev tools' own distribution (devtools/), which adds ``hecate bench`` and ``hecate
chaos`` by entry point when it is installed."""

from __future__ import annotations

from pathlib import Path

from tests.cli.wheels import (
    DEVTOOLS,
    PRODUCT,
    install_dev_entry_points,
    lay_out,
    run_python,
    wheel_files,
)

DEV_PARTS = {"dev", "bench", "chaos"}


def test_the_product_wheel_holds_no_dev_tools() -> None:
    files = wheel_files(PRODUCT)
    assert "hecate/cli/main.py" in files  # the configuration was read, not misread
    assert "hecate/core/cost.py" in files
    dev = sorted(name for name in files if DEV_PARTS & set(name.split("/")[1:2]))
    assert not dev, f"dev tools in the product wheel: {dev[:5]}"


def test_the_dev_wheel_holds_the_dev_tools_and_nothing_of_the_product() -> None:
    files = wheel_files(DEVTOOLS)
    assert "hecate/dev/bench/cli.py" in files
    assert "hecate/dev/chaos/topologies/chaos.json" in files  # package data too
    assert all(name.startswith("hecate/dev/") for name in files)
    assert not set(files) & set(wheel_files(PRODUCT))


HELP = "from hecate.cli.main import main\nmain(['--help'])\n"


def test_hecate_has_bench_and_chaos_only_with_the_dev_tools_installed(tmp_path: Path) -> None:
    (tmp_path / "alone").mkdir()
    alone = run_python(lay_out(PRODUCT, tmp_path / "alone" / "site"), HELP, tmp_path / "alone")
    assert alone.returncode == 0, alone.stderr
    assert "swarm-sim" in alone.stdout
    assert "bench" not in alone.stdout
    assert "chaos" not in alone.stdout

    (tmp_path / "both").mkdir()
    site = lay_out(DEVTOOLS, lay_out(PRODUCT, tmp_path / "both" / "site"))
    install_dev_entry_points(site)
    both = run_python(site, HELP, tmp_path / "both")
    assert both.returncode == 0, both.stderr
    assert "bench" in both.stdout
    assert "chaos" in both.stdout
