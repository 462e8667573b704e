"""Model executors: what a node runs on its layer range.

``Executor`` is the pluggable interface; ``ToyModel`` (registered as ``"toy"`` in
:mod:`hecate.executors`) is the built-in deterministic network that lets tests check any
pipeline split bit-for-bit against ``reference``.
"""

from hecate.model.executor import (
    MAX_LAYERS,
    MAX_TOKENS,
    Executor,
    ExecutorError,
    check_range,
)
from hecate.model.toy import VOCABULARY, ToyModel, reference

__all__ = [
    "MAX_LAYERS",
    "MAX_TOKENS",
    "VOCABULARY",
    "Executor",
    "ExecutorError",
    "ToyModel",
    "check_range",
    "reference",
]
