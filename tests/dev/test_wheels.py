"""The product wheel ships the product only: the benchmarks and chaos scenarios are the
dev tools' own distribution (devtools/), which adds ``hecate bench`` and ``hecate
chaos`` by entry point when it is installed."""

from __future__ import annotations

from pathlib import Path

from tests.dev.wheels import (
    DEVTOOLS,
    PRODUCT,
    install_entry_points,
    lay_out,
    run_python,
    wheel_files,
)


def test_the_product_wheel_holds_no_dev_tools() -> None:
    files = wheel_files(PRODUCT)
    assert "hecate/cli/main.py" in files  # the configuration was read, not misread
    assert "hecate/core/cost.py" in files
    assert "hecate_router/service.py" in files  # every service's package
    assert "hecate_gateway/static/index.html" in files  # package data too
    dev = sorted(name for name in files if name.startswith("hecate_dev/"))
    assert not dev, f"dev tools in the product wheel: {dev[:5]}"


def test_the_dev_wheel_holds_the_dev_tools_and_nothing_of_the_product() -> None:
    files = wheel_files(DEVTOOLS)
    assert "hecate_dev/bench/cli.py" in files
    assert "hecate_dev/chaos/topologies/chaos.json" in files  # package data too
    assert all(name.startswith("hecate_dev/") for name in files)
    assert not set(files) & set(wheel_files(PRODUCT))


HELP = "from hecate.cli.main import main\nmain(['--help'])\n"


def test_hecate_has_bench_and_chaos_only_with_the_dev_tools_installed(tmp_path: Path) -> None:
    (tmp_path / "alone").mkdir()
    site = lay_out(PRODUCT, tmp_path / "alone" / "site")
    install_entry_points(PRODUCT, site)
    alone = run_python(site, HELP, tmp_path / "alone")
    assert alone.returncode == 0, alone.stderr
    assert "swarm-sim" in alone.stdout
    assert "router" in alone.stdout  # the services' commands, by entry point too
    assert "bench" not in alone.stdout
    assert "chaos" not in alone.stdout

    (tmp_path / "both").mkdir()
    site = lay_out(DEVTOOLS, lay_out(PRODUCT, tmp_path / "both" / "site"))
    install_entry_points(PRODUCT, site)
    install_entry_points(DEVTOOLS, site)
    both = run_python(site, HELP, tmp_path / "both")
    assert both.returncode == 0, both.stderr
    assert "bench" in both.stdout
    assert "chaos" in both.stdout
