"""The chaos scenarios' topologies ship inside the package: an installed hecate (a
wheel, no source checkout) finds them, and they are the examples a reader is shown."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from hecate.chaos.scenarios import SCENARIOS, topology
from hecate.sim.topology import parse_topology

ROOT = Path(__file__).resolve().parents[2]


def _wheel_layout(into: Path) -> Path:
    """The files the wheel holds, laid out as it installs them (read from the build
    configuration in pyproject.toml, so that the test follows it)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wheel = config["tool"]["hatch"]["build"]["targets"]["wheel"]
    sources: dict[str, str] = wheel["sources"]
    for included in wheel["only-include"]:
        root, _, rest = included.partition("/")
        target = into / sources.get(root, root) / rest
        shutil.copytree(
            ROOT / included,
            target,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    return into


def test_every_scenario_topology_is_package_data_and_matches_its_example() -> None:
    for name, scenario in SCENARIOS.items():
        shipped = parse_topology(topology(scenario.setup.topology))
        example = parse_topology((ROOT / "examples" / scenario.setup.topology).read_bytes())
        assert shipped == example, name


def test_an_installed_hecate_finds_the_topologies_without_the_repository(
    tmp_path: Path,
) -> None:
    site = _wheel_layout(tmp_path / "site")
    probe = (
        "from pathlib import Path\n"
        "import hecate.chaos.scenarios as s\n"
        "from hecate.sim.topology import parse_topology\n"
        f"assert Path(s.__file__).is_relative_to({str(site)!r}), s.__file__\n"
        "for name, sc in s.SCENARIOS.items():\n"
        "    print(name, len(parse_topology(s.topology(sc.setup.topology)).nodes))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,  # nowhere near examples/
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "node-kill 7" in done.stdout
    assert "llm-kill 6" in done.stdout
