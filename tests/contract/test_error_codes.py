"""The error codes: one type, one status table, and the contract's lists made from them.

mypy holds every emitting call site to :data:`hecate.wire.errors.ErrorCode` (a
``Literal``), so a code with no status cannot be written. What is left to test: that
the type and the status table name the same codes, that a code read off the wire is
narrowed safely, and that the lists of what each caller can receive (``INFER_CODES``,
``STAGE_CODES``) are exactly what the code on that side emits, read from the source:
the string literals passed as the code of a ``ServiceError``, ``ExecutorError``,
``UpstreamRefused``, ``ErrorBody``, ``reply_error`` or the router's reply helpers, plus
the ``code`` of every routing error the core raises.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path
from typing import get_args

from hypothesis import given
from hypothesis import strategies as st

from hecate.core.errors import RoutingError
from hecate.wire.errors import INFER_CODES, STAGE_CODES, STATUS, ErrorCode, as_code, is_code

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / "shared" / "hecate"
ROUTER = ROOT / "services" / "hecate_router"
NODE = ROOT / "services" / "hecate_node"
# Modules whose error replies go to a caller of hecate.infer.<model>.
INFER_SIDE = (
    ROUTER / "service.py",
    ROUTER / "desk.py",
    ROUTER / "lifecycle.py",
    ROUTER / "rescue.py",
    # The service shell's layers wrap the infer endpoint as any other (an unexpected
    # failure in the router answers ``internal``).
    SHARED / "bus" / "layers.py",
)
# Modules whose error replies go to a node's caller: the node, the service shell it runs
# in, and the executors it runs (the registry's unknown_executor stops a start, not a stage).
STAGE_SIDE = (
    *sorted(NODE.glob("*.py")),
    SHARED / "bus" / "service.py",
    SHARED / "bus" / "endpoint.py",
    SHARED / "bus" / "layers.py",
    *sorted((SHARED / "model").rglob("*.py")),
    *sorted((SHARED / "llm").rglob("*.py")),
)

# Constructors whose first argument is a wire error code.
# (A request handle's ``error``, the lifecycle's ``_error``, ``Abort`` and a rescue's
# ``GiveUp`` too.)
CODE_FIRST = {
    "ServiceError",
    "ExecutorError",
    "UpstreamRefused",
    "error",
    "_error",
    "Abort",
    "GiveUp",
}
# Reply helpers: (reply subject or admission, code, message, ...).
CODE_SECOND = {"reject", "_reject", "reply_error"}


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


def test_the_type_and_the_status_table_name_the_same_codes() -> None:
    members = get_args(ErrorCode)
    assert [c for c, n in Counter(members).items() if n > 1] == []
    assert set(members) == set(STATUS)
    assert set(INFER_CODES) <= set(STATUS)
    assert set(STAGE_CODES) <= set(STATUS)


@given(st.text(max_size=24) | st.sampled_from(get_args(ErrorCode)))
def test_a_code_off_the_wire_is_kept_if_known_else_internal(code: str) -> None:
    known = code in STATUS
    assert is_code(code) is known
    assert as_code(code) == (code if known else "internal")


def test_the_scan_finds_the_codes_it_must() -> None:
    # Guards the scanner itself: if these stop being found, the scan is blind.
    everything = set().union(*(emitted(p) for p in (*INFER_SIDE, *STAGE_SIDE)))
    assert {"payload_too_large", "bad_range", "rate_limited", "draining"} <= everything
    assert {"no_responders", "internal"} <= everything  # reply_error(reply, code, ...)


def test_infer_codes_are_exactly_what_a_caller_can_receive() -> None:
    from hecate_router.flow import REQUEST_FAULTS  # a node's, passed on to the caller

    router_side = set().union(*map(emitted, INFER_SIDE)) | routing_codes() | REQUEST_FAULTS
    assert router_side - set(INFER_CODES) == set(), "emitted but missing from INFER_CODES"
    assert set(INFER_CODES) - router_side == set(), "listed in INFER_CODES but never emitted"


def test_stage_codes_are_exactly_what_a_node_can_reply() -> None:
    node_side = set().union(*map(emitted, STAGE_SIDE))
    assert node_side - set(STAGE_CODES) == set(), "emitted but missing from STAGE_CODES"
    assert set(STAGE_CODES) - node_side == set(), "listed in STAGE_CODES but never emitted"


def test_the_contract_lists_every_code_from_the_tables() -> None:
    from hecate.wire.contract import INFER_ERROR, STAGE_ERROR

    for code in INFER_CODES:
        assert f"`{code}`" in INFER_ERROR.description
    for code in STAGE_CODES:
        assert f"`{code}`" in STAGE_ERROR.description
