"""Model executors: what a node runs on its layer range.

``Executor`` is the pluggable interface; ``ToyModel`` (registered as ``"toy"``) is the
built-in deterministic network that lets tests check any pipeline split bit-for-bit
against ``reference``.
"""

from hecate.model.executor import (
    EXECUTORS,
    MAX_LAYERS,
    MAX_TOKENS,
    Executor,
    ExecutorError,
    check_range,
    get_executor,
)
from hecate.model.toy import VOCABULARY, ToyModel, reference

__all__ = [
    "EXECUTORS",
    "MAX_LAYERS",
    "MAX_TOKENS",
    "VOCABULARY",
    "Executor",
    "ExecutorError",
    "ToyModel",
    "check_range",
    "get_executor",
    "reference",
]
