"""The pluggable interface a node uses to execute its layer range of a model.

The interface below (:class:`Executor`) is the one the activation-passing executors
implement (``toy``, ``null``): turn a prompt into the activation entering layer 0
(``embed``), push an activation through a contiguous range of layers (``run``), and turn
the activation leaving the last layer into text (``decode``). Activations cross the wire
as opaque ``bytes``, so the transport never needs to know what an executor computes.

Two other kinds exist, and the node tells them apart by attributes, not by this
protocol: a *generative* executor (``generative = True``, the real model in
``hecate.llm``) answers one generation step per call (``step``) and keeps a KV cache per
session; a *whole-model* executor (``whole_model = True``, an upstream HTTP provider)
answers a whole request (``complete``). Both still carry the three methods above only to
satisfy the registry's type, and raise if called.

An executor that computes on the node itself also offers ``warm_up`` (:class:`WarmsUp`):
one pass of a range on made-up input, which the node times when it adopts new holdings,
so that it announces a latency it measured instead of carrying the cost model's cold
penalty until traffic happens to reach it. A whole-model executor does not: its pass
would be a paid call to a provider.

Executors are looked up by name in :mod:`hecate.executors` (``get_executor``), above
this module and :mod:`hecate.llm` alike, so a node's configuration can pick the built-in
deterministic ``toy`` model in tests and a real engine in production without the service
code changing, and the real model's package imports nothing that imports it back.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from hecate.core.errors import ErrorCode

#: Upper bound on a model's depth; a range ending past it is rejected as ``bad_range``.
MAX_LAYERS = 4096
#: Upper bound on ``max_tokens`` for ``decode``.
MAX_TOKENS = 4096


class ExecutorError(Exception):
    """An executor refused a request; ``code`` is stable (wire, metrics), ``message`` is for people.

    Codes: ``bad_activation`` (payload of the wrong size or type, or not finite),
    ``bad_range`` (``start < 0``, ``end <= start`` or ``end`` past ``MAX_LAYERS``),
    ``bad_max_tokens`` (``max_tokens`` outside ``0..MAX_TOKENS``) and
    ``unknown_executor`` (no executor registered under that name).
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code: ErrorCode = code
        self.message = message

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@runtime_checkable
class Executor(Protocol):
    """What a node needs from a model implementation; activations are opaque bytes."""

    name: str

    def embed(self, model_id: str, prompt: str) -> bytes:
        """The activation entering layer 0 for ``prompt``."""
        ...

    def run(self, model_id: str, layer_start: int, layer_end: int, activation: bytes) -> bytes:
        """Apply layers ``[layer_start, layer_end)`` of ``model_id`` to ``activation``."""
        ...

    def decode(self, model_id: str, layers: int, activation: bytes, max_tokens: int) -> str:
        """Text from the activation leaving layer ``layers - 1`` (the model's last)."""
        ...


@runtime_checkable
class WarmsUp(Protocol):
    """An executor that can run one of its ranges without a request."""

    def warm_up(self, model_id: str, layer_start: int, layer_end: int) -> None:
        """Run layers ``[layer_start, layer_end)`` once on a valid made-up input of the
        right shape, as a stage of that range would, and leave no state behind.

        Raises :class:`ExecutorError` (or anything the range's loading raises) if the
        range cannot run here."""
        ...


def check_range(layer_start: int, layer_end: int, max_layers: int = MAX_LAYERS) -> None:
    """Raise ``bad_range`` unless ``0 <= layer_start < layer_end <= max_layers``.

    Shared by executors so every implementation rejects the same ranges the same way.
    """
    if layer_start < 0 or layer_end <= layer_start or layer_end > max_layers:
        raise ExecutorError(
            "bad_range",
            f"layer range [{layer_start}, {layer_end}) is invalid: need "
            f"0 <= start < end <= {max_layers}",
        )
