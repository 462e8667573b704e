"""The executor registry: a node's ``--executor`` name to the object that computes.

It sits above both executor families so neither imports the other: the activation
passing ones in :mod:`hecate.model` (``toy``, ``null``) and the real model in
:mod:`hecate.llm` (``smollm2``) each import only the shared types of
:mod:`hecate.model.executor`, and this module imports them all. Factories import their
executor when called, so naming ``toy`` never loads numpy's model code for ``smollm2``.
"""

from __future__ import annotations

from collections.abc import Callable

from hecate.model.executor import Executor, ExecutorError


def _toy() -> Executor:
    from hecate.model.toy import ToyModel

    return ToyModel()


def _null() -> Executor:
    from hecate.model.null import NullModel

    return NullModel()


def _smollm2() -> Executor:
    from hecate.llm.executor import LlmExecutor

    return LlmExecutor()


#: Name -> factory. Factories take no arguments so a node config needs only a name.
EXECUTORS: dict[str, Callable[[], Executor]] = {"toy": _toy, "null": _null, "smollm2": _smollm2}


def get_executor(name: str) -> Executor:
    """A fresh executor registered under ``name``, or ``unknown_executor``."""
    try:
        factory = EXECUTORS[name]
    except KeyError:
        known = ", ".join(sorted(EXECUTORS)) or "(none)"
        raise ExecutorError(
            "unknown_executor", f"no executor named {name!r}; known executors: {known}"
        ) from None
    return factory()
