"""No module a newcomer must read whole is longer than a sitting: at most 400 lines in
the shared library and the services, but for the wire's tables (the contract every
subject, schema and permission is derived from), and the request lifecycle, the
router's state machine, within 300."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 400
TABLES = {"shared/hecate/wire/contract.py", "shared/hecate/wire/permissions.py"}
LIFECYCLE = ("services/hecate_router/lifecycle.py", 300)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_is_over_its_limit() -> None:
    over = {
        str(p.relative_to(ROOT)): n
        for root in ("shared", "services")
        for p in sorted((ROOT / root).rglob("*.py"))
        if str(p.relative_to(ROOT)) not in TABLES and (n := _lines(p)) > LIMIT
    }
    assert over == {}


def test_the_lifecycle_stays_within_its_own_limit() -> None:
    path, limit = LIFECYCLE
    assert _lines(ROOT / path) <= limit
