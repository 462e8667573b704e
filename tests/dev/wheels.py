"""The files a wheel holds, read from its hatch build configuration (``packages``, each
shipped under its own name, or ``only-include``), so that the tests follow the
configuration rather than a copy of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ROOT / "pyproject.toml"
DEVTOOLS = ROOT / "devtools" / "pyproject.toml"


def wheel_files(pyproject: Path) -> dict[str, Path]:
    """Path inside the wheel -> source file, for every file the wheel ships."""
    config = tomllib.loads(pyproject.read_text())
    wheel = config["tool"]["hatch"]["build"]["targets"]["wheel"]
    base = pyproject.parent
    files: dict[str, Path] = {}
    shipped = [(p, Path(p).name) for p in wheel.get("packages", [])]
    shipped += [(p, p) for p in wheel.get("only-include", [])]
    for included, target in shipped:
        for path in sorted((base / included).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files[(Path(target) / path.relative_to(base / included)).as_posix()] = path
    return files


def lay_out(pyproject: Path, into: Path) -> Path:
    """The wheel's files copied as it installs them (into a site-packages stand-in)."""
    for name, source in wheel_files(pyproject).items():
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, into / name)
    return into


def install_entry_points(pyproject: Path, site: Path) -> None:
    """A distribution's metadata as pip writes it: its entry points, read from its
    pyproject.toml."""
    project = tomllib.loads(pyproject.read_text())["project"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    lines = [
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items())
        for group, points in project["entry-points"].items()
    ]
    (info / "entry_points.txt").write_text("\n".join(lines))


def _third_party(into: Path) -> Path:
    """This environment's installed packages without hecate's own: links to everything
    in site-packages but the hecate distributions and their editable .pth files."""
    into.mkdir()
    purelib = Path(sysconfig.get_paths()["purelib"])
    for entry in purelib.iterdir():
        if not entry.name.lower().lstrip("_").startswith("hecate"):
            (into / entry.name).symlink_to(entry)
    return into


def run_python(site: Path, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``code`` run by a Python that sees the wheels laid out in ``site`` and this
    environment's other packages, but not the source checkout nor its installed
    metadata (no site processing: the editable installs' .pth files are not read)."""
    deps = _third_party(cwd / "third-party")
    return subprocess.run(
        [sys.executable, "-S", "-c", code],
        cwd=cwd,  # nowhere near the repository
        env={"PYTHONPATH": os.pathsep.join([str(site), str(deps)]), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
