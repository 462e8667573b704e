"""The error-code table and the contract's list of codes cannot drift from the code.

The codes are read from the source itself: every string literal passed as the code of
an error a service can put on the wire (``ServiceError``, ``ExecutorError``,
``UpstreamRefused``, ``ErrorBody(code=...)``, and the router's own reply helpers), plus
the ``code`` of every routing error the core raises. A new code added without its entry
in ``hecate.wire.errors`` fails here, and so does an entry no code emits any more.
"""

from __future__ import annotations

import ast
from pathlib import Path

from hecate.core.errors import RoutingError
from hecate.wire.errors import INFER_CODES, STATUS

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "shared" / "hecate").rglob("*.py")) + sorted(
    (ROOT / "services" / "hecate").rglob("*.py")
)
# Modules whose error replies go to a caller of hecate.infer.<model>.
INFER_SIDE = ("services/hecate/services/router.py", "services/hecate/services/quotagate.py")

# Constructors whose first argument is a wire error code.
CODE_FIRST = {"ServiceError", "ExecutorError", "UpstreamRefused"}
# The router's reply helpers: (reply subject or flight, code, message, ...).
CODE_SECOND = {"_reject", "_finish_error"}


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _literal(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value:
        return node.value
    return None


def emitted(path: Path) -> set[str]:
    """The code literals a module puts in error replies."""
    codes: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        candidates: list[ast.expr | None] = [k.value for k in node.keywords if k.arg == "code"]
        if name in CODE_FIRST and node.args:
            candidates.append(node.args[0])
        if name in CODE_SECOND and len(node.args) >= 2:
            candidates.append(node.args[1])
        if name in {"ErrorBody", *CODE_FIRST, *CODE_SECOND}:
            codes |= {c for c in map(_literal, candidates) if c is not None}
    return codes


def routing_codes() -> set[str]:
    seen: set[str] = set()
    todo: list[type[RoutingError]] = list(RoutingError.__subclasses__())
    while todo:
        cls = todo.pop()
        seen.add(cls.code)
        todo.extend(cls.__subclasses__())
    return seen


def test_the_scan_finds_the_codes_it_must() -> None:
    # Guards the scanner itself: if these stop being found, the scan is blind.
    everything = set().union(*(emitted(p) for p in SOURCES))
    assert {"payload_too_large", "bad_range", "rate_limited", "draining"} <= everything


def test_every_code_a_service_emits_has_a_status() -> None:
    missing = {
        (str(p.relative_to(ROOT)), code)
        for p in SOURCES
        for code in emitted(p)
        if code not in STATUS
    }
    assert not missing, f"codes emitted but not in hecate.wire.errors.STATUS: {sorted(missing)}"


def test_infer_codes_are_exactly_what_a_caller_can_receive() -> None:
    from hecate.services.router import REQUEST_FAULTS  # a node's, passed on to the caller

    router_side = (
        set().union(*(emitted(ROOT / p) for p in INFER_SIDE)) | routing_codes() | REQUEST_FAULTS
    )
    assert router_side - set(INFER_CODES) == set(), "emitted but missing from INFER_CODES"
    assert set(INFER_CODES) - router_side == set(), "listed in INFER_CODES but never emitted"
    assert set(INFER_CODES) <= set(STATUS)


def test_the_contract_lists_every_infer_code() -> None:
    from hecate.wire.contract import INFER_ERROR

    for code in INFER_CODES:
        assert f"`{code}`" in INFER_ERROR.description
