"""Model executors: what a node runs on its layer range.

``Executor`` is the pluggable interface (one of three kinds, each a small protocol with
typed inputs and outputs: :mod:`hecate.model.executor`); ``ToyModel`` (registered as ``"toy"`` in
:mod:`hecate.executors`) is the built-in deterministic network that lets tests check any
pipeline split bit-for-bit against ``reference``.
"""

from hecate.model.executor import (
    MAX_LAYERS,
    MAX_TOKENS,
    Executor,
    ExecutorError,
    ExecutorKind,
    LayerExecutor,
    LayerInput,
    LayerOutput,
    StepExecutor,
    StepInput,
    StepOutput,
    WholeExecutor,
    check_range,
)
from hecate.model.toy import VOCABULARY, ToyModel, reference

__all__ = [
    "MAX_LAYERS",
    "MAX_TOKENS",
    "VOCABULARY",
    "Executor",
    "ExecutorError",
    "ExecutorKind",
    "LayerExecutor",
    "LayerInput",
    "LayerOutput",
    "StepExecutor",
    "StepInput",
    "StepOutput",
    "ToyModel",
    "WholeExecutor",
    "check_range",
    "reference",
]
