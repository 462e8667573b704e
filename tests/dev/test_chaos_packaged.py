"""The chaos scenarios' topologies ship inside the dev package: an installed hecate and
its dev tools (the two wheels, no source checkout) find them, and they are the examples
a reader is shown."""

from __future__ import annotations

from pathlib import Path

from hecate.sim.topology import parse_topology
from hecate_dev.chaos.scenarios import SCENARIOS, topology
from tests.dev.wheels import DEVTOOLS, PRODUCT, ROOT, lay_out, run_python


def test_every_scenario_topology_is_package_data_and_matches_its_example() -> None:
    for name, scenario in SCENARIOS.items():
        shipped = parse_topology(topology(scenario.setup.topology))
        example = parse_topology((ROOT / "examples" / scenario.setup.topology).read_bytes())
        assert shipped == example, name


def test_an_installed_hecate_finds_the_topologies_without_the_repository(
    tmp_path: Path,
) -> None:
    site = lay_out(DEVTOOLS, lay_out(PRODUCT, tmp_path / "site"))
    probe = (
        "from pathlib import Path\n"
        "import hecate_dev.chaos.scenarios as s\n"
        "from hecate.sim.topology import parse_topology\n"
        f"assert Path(s.__file__).is_relative_to({str(site)!r}), s.__file__\n"
        "for name, sc in s.SCENARIOS.items():\n"
        "    print(name, len(parse_topology(s.topology(sc.setup.topology)).nodes))\n"
    )
    done = run_python(site, probe, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "node-kill 7" in done.stdout
    assert "llm-kill 6" in done.stdout
