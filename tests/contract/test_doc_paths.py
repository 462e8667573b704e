"""What the docs and the code's own prose point to exists: a file named by its path, a
module by its dotted name, a section by its link.

A doc that names a module which has moved sends its reader to nothing; so does a
docstring. Nothing here is imported: files are listed, modules parsed (``ast``).

Read: ``README.md``, ``docs/*.md`` and ``deploy/**/*.md``, and the docstrings (module,
class, function) and comments of every module under ``shared/``, ``services/`` and
``devtools/``. What counts as a reference in that text (:func:`references`):

* **A path**, ``a/b.ext`` with an extension of ``EXTENSIONS``, backticked or not, a
  ``{x,y}`` in it standing for each name in the braces. One that starts at a top folder
  of the repository (``TOP``: ``shared/hecate/llm/quant.py``) must be that file, from
  the root; one that starts with ``./`` or ``../``, the file from the text's own
  folder, or one that a quoted file names so (``include ./accounts.conf``). Any other
  ``.py`` path (``bus/layers.py``, ``hecate_gateway/tools.py``) must be the tail of some
  file's path, in whole components. Any other path is not checked: it names a file a
  command writes (``k8s/secrets.yaml``) as often as one here.
* **A file name**, ``name.py``: the name of some file of the repository.
* **A dotted name** rooted at a package of the repository (``hecate``, ``hecate_node``,
  ``hecate_dev``, ...), backticked, in a Sphinx role (``:mod:``, ``:class:``, ...) or
  in plain text: its longest prefix that is a module must be one (a ``.py`` file or a
  package), and the name after it must be bound at that module's top level (a def, a
  class, an assignment, an import, a submodule); when that is a class defined there,
  the name after that must be bound in its body (or its ``self``), unless a base from
  elsewhere may bind it. ``hecate.X`` where ``X`` is no module of ``hecate`` is a name
  the code writes on the bus or in traces (``hecate.events.plan``, ``hecate.degraded``)
  or an entry-point group (``hecate.planners``): ``X`` must be one the code writes in a
  string after ``hecate.`` or a group in a ``pyproject.toml``.
* **A relative role** in a module's prose (``:mod:`.chain```): the name in the module's
  package, else, as Sphinx reads it, in any module whose name ends with its first part
  (``:mod:`.vouching``` in a service: ``hecate.bus.vouching``).
* **A Markdown link** to a file of the repository (``[services](docs/SERVICES.md)``),
  from the doc's folder, and its ``#anchor``: a heading of the target, as GitHub makes
  anchors of headings. A section named by its title after its file
  (``docs/SERVICES.md, "Prompt prefixes reused"``) must begin a heading of that file.

URLs are not references (a path inside one is another project's).
"""

from __future__ import annotations

import ast
import functools
import io
import os
import re
import tokenize
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the folders a repository path starts at
TOP = ("shared", "services", "devtools", "tests", "deploy", "docs", "examples")
#: where the packages' folders are
SOURCES = ("shared", "services", "devtools")
EXTENSIONS = ("py", "md", "json", "yaml", "yml", "toml", "conf", "html", "png")
#: not the repository's own files
SKIPPED_DIRS = frozenset({"__pycache__", "build", "node_modules"})

_EXT = "|".join(EXTENSIONS)
# Not inside a longer token, nor a URL: no word character, slash, dot or dash before it.
PATH = re.compile(rf"(?<![\w./:-])((?:\.{{1,2}}/|[\w-][\w.-]*/)+[\w.-]*\.(?:{_EXT}))(?![\w/-])")
# ``hecate_router/{desk,flow}.py``: each name in the braces.
BRACES = re.compile(rf"(?<![\w./:-])((?:[\w-][\w.-]*/)+)\{{([\w.,-]+)\}}\.({_EXT})(?![\w/-])")
FILE_NAME = re.compile(r"(?<![\w./:-])([\w-]+\.py)(?![\w/-])")
DOTTED = re.compile(r"(?<![\w./:-])(hecate(?:_[a-z]+)*)((?:\.[A-Za-z_]\w*)+)")
RELATIVE_ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|exc|obj|const):`~?(\.[\w.]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
SECTION = re.compile(r"([\w./-]+\.md)`?,\s+\"([^\"]+)\"")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
# A string that starts with ``hecate.X``: "hecate.events.plan", f"hecate.node.{id}.run".
LITERAL = re.compile(r"""(?<![\w])[fbr]?["']hecate\.(\w+)""")
REFERENCE_PATTERNS = (PATH, BRACES, FILE_NAME, DOTTED, RELATIVE_ROLE)
CODE_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Ref:
    """One reference and what is wrong with it."""

    where: str  # file:line
    text: str
    problem: str

    def __str__(self) -> str:
        return f"{self.where}: {self.text}: {self.problem}"


def _bound(body: Iterable[ast.stmt]) -> set[str]:
    """The names a block binds at its own level (into ifs and trys, not into defs)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.If | ast.Try | ast.TryStar | ast.With | ast.For):
            blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
            blocks += [h.body for h in getattr(node, "handlers", [])]
            for block in blocks:
                names |= _bound(block)
    return names


def _members(cls: ast.ClassDef) -> set[str]:
    """What a class binds: its body's names and its methods' ``self.x``."""
    names = _bound(cls.body)
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            names.add(node.attr)
    return names


@dataclass
class Tree:
    """The repository's files and modules, as they are on disk."""

    root: Path
    files: frozenset[str] = field(init=False)  # posix paths from the root

    def __post_init__(self) -> None:
        found: set[str] = set()
        for folder, dirs, names in os.walk(self.root):
            dirs[:] = [
                d
                for d in dirs
                if not d.startswith(".") and d not in SKIPPED_DIRS and not d.endswith(".egg-info")
            ]
            rel = Path(folder).relative_to(self.root)
            found.update((rel / n).as_posix() for n in names)
        self.files = frozenset(found)

    @functools.cached_property
    def tails(self) -> frozenset[str]:
        """Every file's path less any number of its leading folders."""
        out: set[str] = set()
        for f in self.files:
            parts = f.split("/")
            out.update("/".join(parts[i:]) for i in range(len(parts)))
        return frozenset(out)

    @functools.cached_property
    def packages(self) -> dict[str, str]:
        """Top-level package name: its folder."""
        return {
            f.split("/")[1]: "/".join(f.split("/")[:2])
            for f in self.files
            if f.split("/")[0] in SOURCES and f.count("/") == 2 and f.endswith("/__init__.py")
        }

    def module_file(self, dotted: str) -> str | None:
        """The file of module ``dotted``, if it is one."""
        head, *rest = dotted.split(".")
        base = self.packages.get(head)
        if base is None:
            return None
        stem = "/".join([base, *rest])
        for candidate in (f"{stem}/__init__.py", f"{stem}.py"):
            if candidate in self.files:
                return candidate
        return None

    def parsed(self, file: str) -> ast.Module:
        return _parse(self.root / file)

    @functools.cached_property
    def namespaces(self) -> frozenset[str]:
        """``X`` of every ``hecate.X...`` the code writes in a string (a subject, a span
        attribute, a logger) or names as an entry-point group."""
        out: set[str] = set()
        for f in self.files:
            if f.endswith(".py") and f.split("/")[0] in SOURCES:
                out.update(LITERAL.findall((self.root / f).read_text()))
            elif f.endswith("pyproject.toml"):
                groups = tomllib.loads((self.root / f).read_text())
                for group in groups.get("project", {}).get("entry-points", {}):
                    out.update(re.findall(r"^hecate\.(\w+)", group))
        return frozenset(out)

    def headings(self, file: str) -> dict[str, str]:
        """A Markdown file's headings: GitHub's anchor of each, to its text."""
        text = CODE_FENCE.sub("", (self.root / file).read_text())
        out: dict[str, str] = {}
        for title in HEADING.findall(text):
            plain = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", title)
            anchor = re.sub(r"[^\w\- ]", "", plain.lower()).replace(" ", "-")
            n, unique = 0, anchor
            while unique in out:
                n += 1
                unique = f"{anchor}-{n}"
            out[unique] = plain
        return out

    # -- checks: None when the reference holds, else what is wrong --------------------

    def check_dotted(self, dotted: str) -> str | None:
        parts = dotted.split(".")
        if parts[0] not in self.packages:
            return f"no package {parts[0]!r} in {', '.join(SOURCES)}"
        if (
            parts[0] == "hecate"
            and len(parts) > 1
            and self.module_file(f"hecate.{parts[1]}") is None
        ):
            if parts[1] in self.namespaces:
                return None  # a name on the bus or in traces, or an entry-point group
            return f"no module hecate.{parts[1]}, nor a name the code writes"
        n = len(parts)
        while self.module_file(".".join(parts[:n])) is None:
            n -= 1
        module = ".".join(parts[:n])
        attrs = parts[n:]
        if not attrs:
            return None
        tree = self.parsed(self.module_file(module) or "")
        top = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
        if "__getattr__" in _bound(tree.body):
            return None  # names made on demand
        if attrs[0] not in _bound(tree.body):
            return f"module {module} has no {attrs[0]!r}"
        cls = top.get(attrs[0])
        if len(attrs) > 1 and cls is not None:
            members = self._class_members(cls, top)
            if members is not None and attrs[1] not in members:
                return f"{module}.{attrs[0]} has no {attrs[1]!r}"
        return None

    def _class_members(self, cls: ast.ClassDef, top: dict[str, ast.ClassDef]) -> set[str] | None:
        """A class's names and its local bases'; None where a base from elsewhere may
        bind any name."""
        names = _members(cls)
        for base in cls.bases:
            local = top.get(base.id) if isinstance(base, ast.Name) else None
            inherited = None if local is None or local is cls else self._class_members(local, top)
            if inherited is None:
                return None
            names |= inherited
        return names

    @functools.cached_property
    def module_names(self) -> frozenset[str]:
        return frozenset(
            f.split("/", 1)[1].removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            for f in self.files
            if f.endswith(".py") and f.split("/")[0] in SOURCES
        )

    def check_relative(self, target: str, package: str) -> str | None:
        """A role's ``.x.y`` in a module of ``package``: ``package.x.y``, else, as Sphinx
        reads it, any module named ``x`` (``.vouching`` in a service: ``hecate.bus.vouching``)."""
        problem = self.check_dotted(package + target)
        if problem is None:
            return None
        head, _, rest = target[1:].partition(".")
        for module in sorted(self.module_names):
            if module.rsplit(".", 1)[-1] == head and not self.check_dotted(
                module + (f".{rest}" if rest else "")
            ):
                return None
        return problem

    def check_path(self, path: str, folder: str) -> str | None:
        """``path`` as written in a text of ``folder`` (posix, from the root)."""
        if path.split("/")[0] in TOP:
            return None if path in self.files else "no such file"
        if path.startswith(("./", "../")):
            local = os.path.normpath(os.path.join(folder, path)).replace(os.sep, "/")
            tail = re.sub(r"^(\.{1,2}/)+", "", path)  # `include ./accounts.conf`, quoted
            return None if local in self.files or tail in self.tails else "no such file"
        if path.endswith(".py"):
            return None if path in self.tails else "no module's path ends so"
        return None  # a file a command writes (`k8s/secrets.yaml`) as often as one here

    def check_file_name(self, name: str) -> str | None:
        return None if name in self.tails else "no module of that name"


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset)


def references(text: str, tree: Tree, *, source: str, line: int = 1) -> Iterator[Ref]:
    """What is wrong with the references of ``text``, found in file ``source`` (posix,
    from the root) from its ``line``: one :class:`Ref` per broken one."""
    folder = source.rsplit("/", 1)[0] if "/" in source else ""
    package = ""  # a module's package is its folder, a package's own __init__ included
    if source.endswith(".py") and source.split("/")[0] in SOURCES:
        package = folder.split("/", 1)[1].replace("/", ".") if folder.count("/") else ""
    for m in RELATIVE_ROLE.finditer(text):
        problem = (
            tree.check_relative(m.group(1), package)
            if package
            else "a relative name outside a package"
        )
        if problem:
            yield Ref(f"{source}:{line + _line(text, m.start())}", m.group(1), problem)
    for m in DOTTED.finditer(text):
        problem = tree.check_dotted(m.group(1) + m.group(2))
        if problem:
            yield Ref(f"{source}:{line + _line(text, m.start())}", m.group(0), problem)
    # A link's target is checked as a link.
    links = [m.span(1) for m in LINK.finditer(text)] if source.endswith(".md") else []
    for m in PATH.finditer(text):
        if any(a <= m.start() < b for a, b in links):
            continue
        problem = tree.check_path(m.group(1), folder)
        if problem:
            yield Ref(f"{source}:{line + _line(text, m.start())}", m.group(1), problem)
    for m in BRACES.finditer(text):
        folder_part, names, ext = m.groups()
        for name in names.split(","):
            path = f"{folder_part}{name}.{ext}"
            problem = tree.check_path(path, folder)
            if problem:
                yield Ref(f"{source}:{line + _line(text, m.start())}", path, problem)
    for m in FILE_NAME.finditer(text):
        problem = tree.check_file_name(m.group(1))
        if problem:
            yield Ref(f"{source}:{line + _line(text, m.start())}", m.group(1), problem)
    if source.endswith(".md"):
        yield from _links(text, tree, source=source, folder=folder, line=line)


def _links(text: str, tree: Tree, *, source: str, folder: str, line: int) -> Iterator[Ref]:
    def where(offset: int) -> str:
        return f"{source}:{line + _line(text, offset)}"

    for m in LINK.finditer(text):
        target = m.group(1)
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        file = os.path.normpath(os.path.join(folder, path)).replace(os.sep, "/") if path else source
        if file not in tree.files:
            yield Ref(where(m.start()), target, "no such file")
        elif anchor and file.endswith(".md") and anchor not in tree.headings(file):
            yield Ref(where(m.start()), target, f"no heading of {file} has this anchor")
    for m in SECTION.finditer(text):
        name, title = m.groups()
        file = name if name.split("/")[0] in TOP else os.path.join(folder, name)
        file = os.path.normpath(file).replace(os.sep, "/")
        headings = tree.headings(file).values() if file in tree.files else [title]
        if not any(h.lower().startswith(title.lower()) for h in headings):
            yield Ref(where(m.start()), f'{name}, "{title}"', f"no heading of {file} says so")


def _docstrings(node: ast.AST) -> Iterator[tuple[int, str]]:
    """The docstrings of a module, class or function and of every one within it."""
    if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        doc = ast.get_docstring(node, clean=False)
        if doc is not None:
            yield node.body[0].lineno, doc
    for child in _statements(node):
        yield from _docstrings(child)


def _statements(node: ast.AST) -> Iterator[ast.stmt]:
    """The statements right inside ``node``: its blocks', a try's handlers', a match's
    cases' (expressions hold no docstring: they are not walked)."""
    for _, value in ast.iter_fields(node):
        if isinstance(value, list):
            for item in value:
                if isinstance(item, ast.stmt):
                    yield item
                elif isinstance(item, ast.ExceptHandler | ast.match_case):
                    yield from item.body


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """A module's docstrings and comments: (line, text)."""
    source = path.read_text()
    yield from _docstrings(_parse(path))
    # Tokenizing is most of the scan's time: only where some line's text after a # may
    # hold a reference (a comment always does, if any).
    tails = (line.partition("#")[2] for line in source.splitlines() if "#" in line)
    if not any(p.search(tail) for tail in tails for p in REFERENCE_PATTERNS):
        return
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


def docs(tree: Tree) -> list[str]:
    """The root's Markdown files, ``docs/*.md`` and ``deploy/**/*.md``."""
    return sorted(
        f
        for f in tree.files
        if f.endswith(".md")
        and (
            "/" not in f or (f.startswith("docs/") and f.count("/") == 1) or f.startswith("deploy/")
        )
    )


def modules(tree: Tree) -> list[str]:
    return sorted(f for f in tree.files if f.endswith(".py") and f.split("/")[0] in SOURCES)


@pytest.fixture(scope="module")
def tree() -> Tree:
    return Tree(ROOT)


def test_every_reference_in_the_docs_exists(tree: Tree) -> None:
    found = [
        str(ref)
        for doc in docs(tree)
        for ref in references((ROOT / doc).read_text(), tree, source=doc)
    ]
    assert not found, "the docs point to what is not there:\n" + "\n".join(found)


def test_every_reference_in_the_code_s_prose_exists(tree: Tree) -> None:
    found = [
        str(ref)
        for module in modules(tree)
        for line, text in prose(ROOT / module)
        for ref in references(text, tree, source=module, line=line)
    ]
    assert not found, "docstrings and comments point to what is not there:\n" + "\n".join(found)


def test_the_scan_reads_the_docs_and_the_code(tree: Tree) -> None:
    assert {"README.md", "docs/SERVICES.md", "docs/CONTRIBUTING.md", "deploy/README.md"} <= set(
        docs(tree)
    )
    assert "services/hecate_node/service.py" in modules(tree)
    assert tree.module_file("hecate_node.chain") == "services/hecate_node/chain.py"
    assert tree.module_file("hecate") == "shared/hecate/__init__.py"


# -- the rules themselves, on sample text ------------------------------------------------

STALE = [
    # a module that moved, named relatively in its package's docstring
    ("services/hecate_node/service.py", "the forward: :mod:`.node_chain`.", ".node_chain"),
    ("services/hecate_node/service.py", "beats (:mod:`.node_meter`)", ".node_meter"),
    # ... by its dotted name, in a role or backticks or plain text
    ("docs/X.md", "see :mod:`hecate_node.node_chain`", "hecate_node.node_chain"),
    ("docs/X.md", "see `hecate_router.routing.hearing`", "hecate_router.routing.hearing"),
    ("docs/X.md", "what hecate.model.reference computes", "hecate.model.reference"),
    ("docs/X.md", "`hecate.llm.onnx_stage.NoSuchStage`", "hecate.llm.onnx_stage.NoSuchStage"),
    (
        "docs/X.md",
        "`hecate.llm.onnx_stage.OnnxStage.no_such`",
        "hecate.llm.onnx_stage.OnnxStage.no_such",
    ),
    ("docs/X.md", "`hecate.routing.hearing`", "hecate.routing.hearing"),
    ("docs/X.md", "`hecate_nowhere.x`", "hecate_nowhere.x"),
    # a path
    (
        "services/hecate_router/flow.py",
        "# its own link's (routing/hearing.py)",
        "routing/hearing.py",
    ),
    ("docs/X.md", "`services/hecate_node/node_chain.py`", "services/hecate_node/node_chain.py"),
    ("docs/X.md", "(`hecate_node/node_meter.py`)", "hecate_node/node_meter.py"),
    ("docs/X.md", "in `node_chain.py`", "node_chain.py"),
    ("docs/X.md", "`hecate_node/{service,node_chain}.py`", "hecate_node/node_chain.py"),
    ("deploy/README.md", "`../docker-compose.yaml`", "../docker-compose.yaml"),
    # a link, its anchor, a section by title
    ("README.md", "[services](docs/NOWHERE.md)", "docs/NOWHERE.md"),
    ("README.md", "[x](docs/SERVICES.md#no-such-section)", "docs/SERVICES.md#no-such-section"),
    ("README.md", '(docs/SERVICES.md, "No such section")', 'docs/SERVICES.md, "No such section"'),
]

SOUND = [
    ("services/hecate_node/service.py", ":mod:`.chain` and :mod:`.meter`"),
    ("services/hecate_node/service.py", ":meth:`.service.Node.execute`"),
    ("services/hecate_launcher/keeping.py", ":class:`~hecate_launcher.keeper.Keeper`"),
    ("docs/X.md", "`hecate.core.chooser.Chooser`, hecate.core.Planner, `hecate_router.affinity`"),
    ("docs/X.md", "`hecate.llm.onnx_stage.OnnxStage._beside`, `hecate.bus.kv.put`"),
    ("docs/X.md", "subjects `hecate.events.plan`, `hecate.node.<id>.run`, `hecate.infer.>`"),
    ("docs/X.md", "span attribute `hecate.degraded`; the `hecate.planners` entry-point group"),
    ("docs/X.md", "metric hecate_gateway_requests_total{model}, `hecate_router.cli:add_parser`"),
    ("docs/X.md", "`shared/hecate/llm/quant.py`, `bus/layers.py`, `states.py`, tests/conftest.py"),
    ("docs/X.md", "`hecate_router/{service,desk,desk_flow}.py`, `hecate/llm/{executor,quant}.py`"),
    ("docs/X.md", "https://github.com/ggml-org/llama.cpp/blob/master/convert_hf_to_gguf.py"),
    ("deploy/README.md", "`../docker-compose.yml`, `nats/accounts.conf`"),
    ("shared/hecate/llm/__init__.py", ":mod:`.onnx_stage`; :class:`.sessions.Sessions`"),
    ("README.md", "[services](docs/SERVICES.md#many-users-at-once-admission-control)"),
    ("README.md", '(docs/SERVICES.md, "Prompt prefixes reused")'),
    ("docs/CONTRIBUTING.md", "[the core](CORE.md)"),
]


@pytest.mark.parametrize(("source", "text", "reported"), STALE)
def test_a_stale_reference_is_reported(tree: Tree, source: str, text: str, reported: str) -> None:
    assert [r.text for r in references(text, tree, source=source)] == [reported]


@pytest.mark.parametrize(("source", "text"), SOUND)
def test_a_sound_reference_is_not(tree: Tree, source: str, text: str) -> None:
    assert [str(r) for r in references(text, tree, source=source)] == []
