"""Imports go down the layers, never up; no service imports another; no two packages
import each other.

Every module of the three parts is parsed (``ast``, nothing is imported): the shared
library ``shared/hecate`` (import name ``hecate``), one package per process in
``services/`` (``hecate_router``, ``hecate_node``, ...) and the developer tools
``devtools/hecate_dev``. Each import of one of them is checked against the layer of its
package. A module may import its own package, another package of its own layer (inside
the shared library only), or any package below. Every import counts wherever it stands:
at the top of the module, inside a function (a lazy import is still a dependency, only a
later one) or under ``if TYPE_CHECKING:`` (a type is knowledge of the layer that defines
it, even if it is never imported at run time).

The layers, lowest first (``LAYERS``); a package of the shared library is named by its
first component below ``hecate`` (``hecate.bus.kv`` is in ``bus``):

0. ``core``, ``resilience``, ``wire``, ``llm``, ``model``, ``sim``: pure logic, wire
   shapes and the model libraries. ``model`` holds the executor protocol's types and
   the toy and null networks and imports nothing of hecate but the error codes and
   kinds (``hecate.core``); the wire carries some of its types as they are (an answer's
   required shape, a token's log-probability); ``llm`` (the real model) implements that protocol, so
   the two are libraries side by side, and the registry that chooses between them
   (``executors``) sits above both. ``sim`` is the swarm lifecycle run in memory over
   the core, which ``hecate swarm-sim`` and the planner's topology reading use.
1. ``bus``, ``executors``: the NATS shell and the executor registry.
2. ``client``: the client SDK.
3. ``cli``: the ``hecate`` command's frame, and what every service process runs in
   (``hecate.cli.process``). It names no service: each service adds its own
   subcommand through the ``hecate.cli`` entry-point group (pyproject.toml).
4. the services, one package per process: ``hecate_router``, ``hecate_node``,
   ``hecate_planner``, ``hecate_telemetry``, ``hecate_breaker``, ``hecate_gateway`` and
   ``hecate_launcher`` (``hecate up``). Each may import the shared library and itself,
   **never another service**: they meet only on the bus, and a process that needs
   another's command runs it (``hecate up`` makes the gateway's key with ``hecate keys
   add``).
5. ``hecate_dev``: the developer tools (``hecate bench``, ``hecate chaos``), a
   distribution of their own beside the product (``devtools/``). They may import
   anything; nothing else imports them, not even lazily: ``hecate`` finds ``hecate
   bench`` and ``hecate chaos`` through the same entry-point group.

A package missing from ``LAYERS`` fails the test: a new package gets its layer here.
There are no exceptions to these rules.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = (
    "hecate_router",
    "hecate_node",
    "hecate_planner",
    "hecate_telemetry",
    "hecate_breaker",
    "hecate_gateway",
    "hecate_launcher",
)
# (source root, top-level package) for every part of the product and its tools.
PACKAGES = (
    (ROOT / "shared", "hecate"),
    *((ROOT / "services", name) for name in SERVICES),
    (ROOT / "devtools", "hecate_dev"),
)

LAYERS: dict[str, int] = {
    "hecate": 0,  # the package itself: its docstring
    "core": 0,
    "resilience": 0,
    "wire": 0,
    "llm": 0,
    "model": 0,
    "sim": 0,
    "bus": 1,
    "executors": 1,
    "client": 2,
    "cli": 3,
    **dict.fromkeys(SERVICES, 4),
    "hecate_dev": 5,
}
LAYER_NAMES = {
    0: "core, resilience, wire, llm, model, sim",
    1: "bus, executors",
    2: "client",
    3: "cli",
    4: "the services",
    5: "hecate_dev (the dev tools: bench, chaos)",
}


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
    """``hecate.bus.service`` -> ``bus``; ``hecate_router.desk`` -> ``hecate_router``."""
    parts = module.split(".")
    return parts[1] if parts[0] == "hecate" and len(parts) > 1 else parts[0]


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root, name in PACKAGES:
        for path in sorted((root / name).rglob("*.py")):
            found[_module_name(root, path)] = path
    return found


TOP_LEVEL = {name for _, name in PACKAGES}


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
            # ``from hecate_dev.bench import cli`` imports the module hecate_dev.bench.cli.
            name = f"{base}.{alias.name}"
            self._add(node.lineno, name if name in self.known else base)

    def _add(self, line: int, imported: str) -> None:
        if imported.split(".")[0] in TOP_LEVEL and imported != "hecate":
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


def violations(imports: Iterable[Import]) -> list[str]:
    """One line per import that goes up a layer, or from one service into another."""
    out: list[str] = []
    for imp in imports:
        src, dst = imp.edge
        if src == dst:
            continue
        if LAYERS[dst] < LAYERS[src] or (LAYERS[dst] == LAYERS[src] != 4):
            continue
        if LAYERS[dst] == LAYERS[src]:
            rule = "a service never imports another: they meet on the bus"
        elif dst == "hecate_dev":
            rule = "the product reaches the dev tools only by entry point"
        else:
            rule = "imports go down the layers only"
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


def package_edges(imports: Iterable[Import]) -> dict[tuple[str, str], Import]:
    """Each import between two packages, one example each."""
    edges: dict[tuple[str, str], Import] = {}
    for imp in imports:
        src, dst = imp.edge
        if src != dst:
            edges.setdefault((src, dst), imp)
    return edges


IMPORTS = collect_imports()


def test_every_package_has_a_layer() -> None:
    packages = {package(m) for m in _modules()} | {imp.edge[1] for imp in IMPORTS}
    missing = sorted(packages - set(LAYERS))
    assert not missing, f"give these packages a layer in LAYERS: {missing}"


def test_imports_go_down_the_layers() -> None:
    found = violations(IMPORTS)
    assert not found, "imports against the layers:\n" + "\n".join(found)


def test_no_two_packages_import_each_other() -> None:
    edges = package_edges(IMPORTS)
    cycle = package_cycle(edges)
    if cycle is not None:
        steps = [
            f"  {a} -> {b}: {edges[a, b].where()} imports {edges[a, b].imported}"
            for a, b in pairwise(cycle)
        ]
        raise AssertionError("packages import each other:\n" + "\n".join(steps))


def test_the_scan_sees_lazy_imports_and_the_dev_package() -> None:
    # A scan that missed imports inside functions, or the dev package's source root,
    # would pass everything.
    lazy = {imp.imported for imp in IMPORTS if imp.function == "_swarm_sim"}
    assert "hecate.core.chooser" in lazy
    dev = {imp.importer for imp in IMPORTS if package(imp.importer) == "hecate_dev"}
    assert {"hecate_dev.bench.cli", "hecate_dev.chaos.harness"} <= dev
    services = {package(imp.importer) for imp in IMPORTS}
    assert set(SERVICES) <= services


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


def test_every_service_adds_its_command_by_entry_point() -> None:
    """Each service's subcommands come in through the ``hecate.cli`` group, naming a
    function of that service that exists; the shared frame imports none of them."""
    from hecate.cli.main import PLUGIN_GROUP

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    points: dict[str, str] = config["project"]["entry-points"][PLUGIN_GROUP]
    modules = _modules()
    owners = set()
    for target in points.values():
        module, _, function = target.partition(":")
        tree = ast.parse(modules[module].read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert function in defined, target
        owners.add(package(module))
    assert owners == set(SERVICES)


def test_an_upward_import_a_sideways_one_and_a_cycle_are_caught() -> None:
    up = Import("x.py", 3, "hecate.bus.service", "hecate_router.service", None)
    lazy = Import("y.py", 9, "hecate.cli.main", "hecate_dev.bench.cli", "build_parser")
    back = Import("z.py", 5, "hecate_router.service", "hecate.bus.service", None)
    side = Import("w.py", 7, "hecate_launcher.up", "hecate_gateway.keys", "gateway_key")
    peer = Import("v.py", 2, "hecate.bus.kv", "hecate.wire.messages", None)
    found = violations([up, lazy, back, side, peer])
    assert [line.split(":")[0] for line in found] == ["x.py", "y.py", "w.py"]
    assert "a service never imports another" in found[2]
    assert package_cycle(package_edges([up, back])) == ["bus", "hecate_router", "bus"]
    assert package_cycle(package_edges([back])) is None
