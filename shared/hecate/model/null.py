"""``null``: an executor that does no arithmetic, for measuring the bus path alone.

``hecate bench bus`` compares routed requests with raw NATS request/reply; with the toy
model in the nodes, the figure would mix the network's cost with the model's. This
executor passes a fixed-size activation through unchanged, so what remains is routing,
encoding and messaging. Never use it to serve answers.
"""

from __future__ import annotations

from hecate.model.executor import (
    MAX_LAYERS,
    MAX_TOKENS,
    ExecutorError,
    LayerNetwork,
    check_range,
)

ACTIVATION = bytes(256)


class NullModel(LayerNetwork):
    name = "null"

    def embed(self, model_id: str, prompt: str) -> bytes:
        del model_id, prompt
        return ACTIVATION

    def run(self, model_id: str, layer_start: int, layer_end: int, activation: bytes) -> bytes:
        del model_id
        check_range(layer_start, layer_end, MAX_LAYERS)
        if len(activation) != len(ACTIVATION):
            raise ExecutorError("bad_activation", f"expected {len(ACTIVATION)} bytes")
        return activation

    def decode(self, model_id: str, layers: int, activation: bytes, max_tokens: int) -> str:
        del model_id, layers, activation
        if not 0 <= max_tokens <= MAX_TOKENS:
            raise ExecutorError("bad_max_tokens", f"max_tokens must be in [0, {MAX_TOKENS}]")
        return " ".join(["null"] * max_tokens)

    def warm_up(self, model_id: str, layer_start: int, layer_end: int) -> None:
        self.run(model_id, layer_start, layer_end, ACTIVATION)
