"""Model executors: what a node runs on its layer range.

``Executor`` is the pluggable interface (one of three kinds, each a small protocol with
typed inputs and outputs: :mod:`hecate.model.executor`); :mod:`hecate.model.toy`'s
``ToyModel`` (registered as ``"toy"`` in :mod:`hecate.executors`) is the built-in
deterministic network that lets tests check any pipeline split bit-for-bit against
``reference``. It is imported from there, not here: the types alone (all a router
needs) come without numpy.
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

__all__ = [
    "MAX_LAYERS",
    "MAX_TOKENS",
    "Executor",
    "ExecutorError",
    "ExecutorKind",
    "LayerExecutor",
    "LayerInput",
    "LayerOutput",
    "StepExecutor",
    "StepInput",
    "StepOutput",
    "WholeExecutor",
    "check_range",
]
