"""Imports go down the layers, never up, and no two packages import each other.

Every module under ``shared/hecate``, ``services/hecate`` and ``devtools/hecate`` is
parsed (``ast``, nothing is imported) and each ``hecate.*`` import it makes is checked
against the layer of its package. A module may import its own package, another package
of its own layer, or any package below. Every import counts wherever it stands: at the
top of the module, inside a function (a lazy import is still a dependency, only a later
one) or under ``if TYPE_CHECKING:`` (a type is knowledge of the layer that defines it,
even if it is never imported at run time).

The layers, lowest first (``LAYERS``):

0. ``core``, ``resilience``, ``wire``, ``llm``, ``model``, ``sim``: pure logic, wire
   shapes and the model libraries. ``model`` holds the executor protocol's types and
   the toy and null networks and imports nothing of hecate but the error codes
   (``hecate.core.errors``); ``llm`` (the real model) implements that protocol, so
   the two are libraries side by side, and the registry
   that chooses between them (``executors``) sits above both. ``sim`` is the swarm
   lifecycle run in memory over the core; it imports nothing but ``core``, and the
   planner reads topologies through it (``hecate.sim.topology``), so it lives with the
   core.
1. ``bus``, ``executors``: the NATS shell and the executor registry.
2. ``routing``: the router's pure policy: the chooser it shares with ``hecate swarm-sim``,
   the request lifecycle, the quota wait and the retry book (no I/O; the router
   service is their shell).
3. ``services``, ``client``, ``launch``, ``gateway``: the service shells, the client SDK,
   process launching and the HTTP gateway (a service that speaks HTTP on one side).
4. ``cli``: the ``hecate`` command.
5. ``dev``: the developer tools (``hecate.dev.bench``, ``hecate.dev.chaos``), a
   distribution of their own beside the product (``devtools/``). They may import
   anything; nothing else imports them, not even lazily: ``hecate`` finds ``hecate
   bench`` and ``hecate chaos`` through the ``hecate.cli`` entry-point group the dev
   package declares (``test_the_dev_commands_come_in_by_entry_point`` holds it to that).

A package missing from ``LAYERS`` fails the test: a new package gets its layer here.
``KNOWN_EXCEPTIONS`` lists each import allowed against these rules, with why; an entry
no import needs any more fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = (ROOT / "shared", ROOT / "services", ROOT / "devtools")

LAYERS: dict[str, int] = {
    "core": 0,
    "resilience": 0,
    "wire": 0,
    "llm": 0,
    "model": 0,
    "sim": 0,
    "bus": 1,
    "executors": 1,
    "routing": 2,
    "services": 3,
    "client": 3,
    "launch": 3,
    "gateway": 3,
    "cli": 4,
    "dev": 5,
}
LAYER_NAMES = {
    0: "core, resilience, wire, llm, model, sim",
    1: "bus, executors",
    2: "routing",
    3: "services, client, launch, gateway",
    4: "cli",
    5: "dev (the dev tools: bench, chaos)",
}

# (importing module, imported module) -> why it is allowed for now.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    path: str  # relative to the repository, for the failure message
    line: int
    importer: str  # dotted module name
    imported: str  # dotted module name (a package when the name is not a module)
    function: str | None  # the outermost function the import stands in, if any

    @property
    def edge(self) -> tuple[str, str]:
        return package(self.importer), package(self.imported)

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def package(module: str) -> str:
    """``hecate.bus.service`` -> ``bus``; ``hecate.launch`` -> ``launch``."""
    return module.split(".")[1]


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root in SOURCE_ROOTS:
        for path in sorted((root / "hecate").rglob("*.py")):
            found[_module_name(root, path)] = path
    return found


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: Iterable[str]) -> None:
        self.module = module
        self.is_package = is_package
        self.known = set(known)
        self.function: str | None = None
        self.found: list[tuple[int, str, str | None]] = []

    def _in_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer = self.function
        self.function = outer or node.name
        self.generic_visit(node)
        self.function = outer

    visit_FunctionDef = _in_function
    visit_AsyncFunctionDef = _in_function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node.lineno, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            here = self.module.split(".")
            if not self.is_package:
                here.pop()
            here = here[: len(here) - (node.level - 1)]
            base = ".".join([*here, base] if base else here)
        for alias in node.names:
            # ``from hecate.dev.bench import cli`` imports the module hecate.dev.bench.cli.
            name = f"{base}.{alias.name}"
            self._add(node.lineno, name if name in self.known else base)

    def _add(self, line: int, imported: str) -> None:
        if imported == "hecate" or imported.startswith("hecate."):
            self.found.append((line, imported, self.function))


def collect_imports() -> list[Import]:
    modules = _modules()
    out: list[Import] = []
    for module, path in modules.items():
        collector = _Collector(module, path.name == "__init__.py", modules)
        collector.visit(ast.parse(path.read_text(), filename=str(path)))
        rel = str(path.relative_to(ROOT))
        out += [Import(rel, line, module, imported, fn) for line, imported, fn in collector.found]
    return out


def _describe(name: str) -> str:
    layer = LAYERS[name]
    return f"{name} (layer {layer}: {LAYER_NAMES[layer]})"


def violations(imports: Iterable[Import], exceptions: Mapping[tuple[str, str], str]) -> list[str]:
    """One line per import that goes up a layer without a listed reason."""
    out: list[str] = []
    for imp in imports:
        if (imp.importer, imp.imported) in exceptions:
            continue
        src, dst = imp.edge
        if LAYERS[dst] <= LAYERS[src]:
            continue
        rule = (
            "the product reaches the dev tools only by entry point"
            if dst == "dev"
            else "imports go down the layers only"
        )
        out.append(
            f"{imp.where()}: {imp.importer} imports {imp.imported}: "
            f"{_describe(src)} -> {_describe(dst)}; {rule}"
        )
    return out


def package_cycle(edges: Mapping[tuple[str, str], Import]) -> list[str] | None:
    """A cycle of packages (first package repeated at the end), or None: depth-first
    search, a package met again while still on the path closes a cycle."""
    graph: dict[str, set[str]] = {}
    for src, dst in edges:
        graph.setdefault(src, set()).add(dst)
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if (found := visit(nxt)) is not None:
                return found
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        if (found := visit(start)) is not None:
            return found
    return None


def package_edges(
    imports: Iterable[Import], exceptions: Mapping[tuple[str, str], str]
) -> dict[tuple[str, str], Import]:
    """Each import between two packages (not a listed exception), one example each."""
    edges: dict[tuple[str, str], Import] = {}
    for imp in imports:
        src, dst = imp.edge
        if src != dst and (imp.importer, imp.imported) not in exceptions:
            edges.setdefault((src, dst), imp)
    return edges


IMPORTS = collect_imports()


def test_every_package_has_a_layer() -> None:
    packages = {package(m) for m in _modules()} | {imp.edge[1] for imp in IMPORTS}
    missing = sorted(packages - set(LAYERS))
    assert not missing, f"give these packages a layer in LAYERS: {missing}"


def test_imports_go_down_the_layers() -> None:
    found = violations(IMPORTS, KNOWN_EXCEPTIONS)
    assert not found, "imports against the layers:\n" + "\n".join(found)


def test_no_two_packages_import_each_other() -> None:
    edges = package_edges(IMPORTS, KNOWN_EXCEPTIONS)
    cycle = package_cycle(edges)
    if cycle is not None:
        steps = [
            f"  {a} -> {b}: {edges[a, b].where()} imports {edges[a, b].imported}"
            for a, b in pairwise(cycle)
        ]
        raise AssertionError("packages import each other:\n" + "\n".join(steps))


def test_every_known_exception_is_still_needed() -> None:
    seen = {(imp.importer, imp.imported) for imp in IMPORTS}
    stale = sorted(set(KNOWN_EXCEPTIONS) - seen)
    assert not stale, f"no import needs these KNOWN_EXCEPTIONS entries any more: {stale}"


def test_the_scan_sees_lazy_imports_and_the_dev_package() -> None:
    # A scan that missed imports inside functions, or the dev package's source root,
    # would pass everything.
    lazy = {imp.imported for imp in IMPORTS if imp.function == "_swarm_sim"}
    assert "hecate.routing" in lazy
    dev = {imp.importer for imp in IMPORTS if package(imp.importer) == "dev"}
    assert {"hecate.dev.bench.cli", "hecate.dev.chaos.harness"} <= dev


def test_the_dev_commands_come_in_by_entry_point() -> None:
    """The dev package declares ``hecate bench`` and ``hecate chaos`` in the group the
    ``hecate`` parser reads, each naming a function that exists."""
    from hecate.cli.main import PLUGIN_GROUP

    config = tomllib.loads((ROOT / "devtools" / "pyproject.toml").read_text())
    points: dict[str, str] = config["project"]["entry-points"][PLUGIN_GROUP]
    assert set(points) == {"bench", "chaos"}
    modules = _modules()
    for target in points.values():
        module, _, function = target.partition(":")
        tree = ast.parse(modules[module].read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert function in defined, target


def test_an_upward_import_and_a_cycle_are_caught() -> None:
    up = Import("x.py", 3, "hecate.bus.service", "hecate.services.router", None)
    lazy = Import("y.py", 9, "hecate.cli.main", "hecate.dev.bench.cli", "build_parser")
    back = Import("z.py", 5, "hecate.services.router", "hecate.bus.service", None)
    found = violations([up, lazy, back], {})
    assert [line.split(":")[0] for line in found] == ["x.py", "y.py"]
    assert package_cycle(package_edges([up, back], {})) == ["bus", "services", "bus"]
    assert package_cycle(package_edges([back], {})) is None
