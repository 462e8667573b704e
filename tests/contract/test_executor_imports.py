"""The executors are libraries: the model packages know the shared executor types, the
kinds of executor and the error codes, nothing of the wire, the bus or the services that
run them.

``test_layers`` already keeps them below the services; this holds them tighter, so that
an executor stays usable (and testable) without any of HECATE's messaging: the node
converts its wire messages into the executor's typed inputs, never the other way round.
"""

from __future__ import annotations

from tests.contract.test_layers import IMPORTS

LIBRARIES = ("llm", "model")
ALLOWED = (
    "hecate.core.errors",
    "hecate.core.kinds",
    "hecate.model.executor",
    "hecate.model",
    "hecate.llm",
)


def test_the_model_libraries_import_only_the_executor_types_and_the_error_codes() -> None:
    found = [
        f"{imp.where()}: {imp.importer} imports {imp.imported}"
        for imp in IMPORTS
        if imp.edge[0] in LIBRARIES
        and not any(imp.imported == a or imp.imported.startswith(f"{a}.") for a in ALLOWED)
    ]
    assert not found, "the model libraries import beyond the executor types:\n" + "\n".join(found)


def test_the_llm_package_is_seen_by_the_scan() -> None:
    assert any(
        imp.importer == "hecate.llm.executor" and imp.imported == "hecate.model.executor"
        for imp in IMPORTS
    )
