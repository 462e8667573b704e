"""The built-in deterministic model: a small numpy network nodes can really execute.

Its job is to make pipelines checkable. Every layer's weights are a pure function of
``(seed, model_id, layer)``, so any node, in any process, regenerates exactly the
weights every other node would; the same prompt therefore yields bit-identical output
however the layers are split across nodes, and ``reference`` gives the single-process
answer a test compares against.

Why the output is bit-identical across splits and processes:

* Seeds come from SHA-256 (never Python's ``hash()``, which is salted per process
  through ``PYTHONHASHSEED``) and feed numpy's ``SeedSequence``/PCG64, whose streams are
  fixed by numpy across processes.
* Layers are applied one at a time, in order, whatever the range; a split merely
  serializes the float32 activation between two layers, and float32 -> little-endian
  bytes -> float32 is lossless. So ``run(0, k)`` then ``run(k, L)`` performs exactly the
  same float operations, on exactly the same values, as ``run(0, L)``.
* All layer arithmetic is float32 (``np.dot`` then ``np.tanh``); same inputs, same
  kernels, same bits. Caveat: numpy picks BLAS / SIMD kernels per CPU, so bit equality
  is guaranteed between processes on the same host and numpy build, not across
  heterogeneous CPUs.

Pure module: no I/O, no clock, no global mutable state beyond each instance's cache.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict

import numpy as np
import numpy.typing as npt

from hecate.model.executor import (
    MAX_LAYERS,
    MAX_TOKENS,
    ExecutorError,
    LayerNetwork,
    check_range,
)

Vector = npt.NDArray[np.float32]
Matrix = npt.NDArray[np.float32]

# Domain tags: the first entropy word, so a layer seed can never equal an embed seed.
_LAYER_TAG = 1
_EMBED_TAG = 2

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "sh", "th")
_RIMES = ("a", "e", "i", "o", "u", "an", "en", "in", "on", "ar", "or", "el", "il", "ul")
_RIMES_MORE = ("as", "os")
#: 256 distinct pseudo-words (no rime starts with "h", so "s"+"h..." never meets "sh"+...);
#: exactly 256 so one digest byte picks a word uniformly.
VOCABULARY: tuple[str, ...] = tuple(o + r for o in _ONSETS for r in _RIMES + _RIMES_MORE)

#: What ``warm_up`` embeds: the input is made up, only its shape has to be right.
WARM_UP_PROMPT = "warm-up"


def _digest_words(data: bytes) -> list[int]:
    """SHA-256 of ``data`` as 8 uint32 words: a process-independent, fixed-width seed part.

    Fixed width matters: ``SeedSequence`` concatenates its entropy words, so mixing
    variable-width integers could let two different keys produce the same word list.
    """
    digest = hashlib.sha256(data).digest()
    return [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 32, 4)]


def _utf8(text: str) -> bytes:
    # surrogatepass: any str (even a lone surrogate from a JSON payload) has one encoding.
    return text.encode("utf-8", "surrogatepass")


def _to_bytes(x: Vector) -> bytes:
    """The wire form: raw little-endian float32, whatever the host byte order."""
    return np.asarray(x, dtype="<f4").tobytes()


class ToyModel(LayerNetwork):
    """A tanh MLP of ``hidden``-wide layers, ``x = tanh(x @ W_i + b_i)``, any depth.

    ``W_i ~ N(0, 1/sqrt(hidden))`` and ``b_i ~ N(0, 0.1)``, drawn from a generator seeded
    by ``(seed, sha256(model_id), i)``. Generated weights are cached per
    ``(model_id, layer)`` (least recently used evicted past ``cache_layers``) so a node
    hosting a range does not regenerate them on every request; the cache changes
    speed, never results. Safe to share between threads.
    """

    name: str = "toy"
    max_layers: int = MAX_LAYERS

    def __init__(self, seed: int = 0, hidden: int = 64, *, cache_layers: int = 4096) -> None:
        if not 0 <= seed < 2**32:
            raise ValueError(f"seed must be in [0, 2**32), got {seed}")
        if hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {hidden}")
        if cache_layers < 0:
            raise ValueError(f"cache_layers must be >= 0, got {cache_layers}")
        self.seed = seed
        self.hidden = hidden
        self.cache_layers = cache_layers
        self._cache: OrderedDict[tuple[str, int], tuple[Matrix, Vector]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def activation_bytes(self) -> int:
        """Size of every activation payload: ``hidden`` float32 values."""
        return self.hidden * 4

    @property
    def cached_layers(self) -> int:
        """How many layers' weights are currently cached."""
        with self._lock:
            return len(self._cache)

    # -- the layer network (LayerNetwork.execute runs a stage through these) -----------

    def embed(self, model_id: str, prompt: str) -> bytes:
        """A unit-RMS vector expanded from SHAKE-256 of the seed, the model and the prompt.

        An extendable-output hash gives process-independent bits in a few microseconds
        (seeding a numpy generator per request cost ~100 µs and dominated a node's time).
        The uniform values are centred and scaled to unit RMS rather than unit norm, so
        the first tanh sees inputs in its non-linear range.
        """
        h = hashlib.shake_256()
        h.update(_EMBED_TAG.to_bytes(4, "little") + self.seed.to_bytes(4, "little"))
        h.update(hashlib.sha256(_utf8(model_id)).digest())
        h.update(hashlib.sha256(_utf8(prompt)).digest())
        u = np.frombuffer(h.digest(4 * self.hidden), dtype="<u4").astype(np.float64)
        z = u / 2.0**32 - 0.5
        # np.sum uses numpy's own pairwise summation (no BLAS): the same bits everywhere.
        z *= math.sqrt(self.hidden) / math.sqrt(float(np.sum(z * z)))
        return _to_bytes(z.astype(np.float32))

    def run(self, model_id: str, layer_start: int, layer_end: int, activation: bytes) -> bytes:
        """Apply layers ``[layer_start, layer_end)``, one at a time, in order."""
        check_range(layer_start, layer_end, self.max_layers)
        x = self._parse(activation)
        for i in range(layer_start, layer_end):
            w, b = self._weights(model_id, i)
            # float32 in, float32 out: np.dot on two float32 arrays and np.tanh on a
            # float32 array never widen, so no hidden float64 rounding step differs
            # between a split and an unsplit run.
            x = np.tanh(np.dot(x, w) + b)
        return _to_bytes(x)

    def decode(self, model_id: str, layers: int, activation: bytes, max_tokens: int) -> str:
        """``max_tokens`` pseudo-words, a pure function of the activation bytes.

        Word ``k`` is ``VOCABULARY[sha256(activation || k)[0]]``; ``model_id`` and
        ``layers`` are only validated, so any node holding the final activation decodes
        the same text.
        """
        del model_id  # part of the interface; the text depends on the activation alone
        check_range(0, layers, self.max_layers)
        self._parse(activation)
        if not 0 <= max_tokens <= MAX_TOKENS:
            raise ExecutorError(
                "bad_max_tokens", f"max_tokens must be in [0, {MAX_TOKENS}], got {max_tokens}"
            )
        base = hashlib.sha256(bytes(activation))
        words: list[str] = []
        for step in range(max_tokens):
            h = base.copy()  # hash the activation once; extend with the step per word
            h.update(step.to_bytes(4, "little"))
            words.append(VOCABULARY[h.digest()[0]])
        return " ".join(words)

    def count(self, model_id: str, text: str) -> int:
        """Words: the toy's tokens. Its decoded text is one pseudo-word per token
        (``max_tokens`` of them, none with a space in it), and a prompt, which it hashes
        whole, counts in the same unit, its whitespace-separated words."""
        del model_id
        return len(text.split())

    def warm_up(self, model_id: str, layer_start: int, layer_end: int) -> None:
        """The range once on a fixed prompt's embedding (any layer takes that shape),
        which also puts the range's weights in the cache."""
        self.run(model_id, layer_start, layer_end, self.embed(model_id, WARM_UP_PROMPT))

    # -- internals -------------------------------------------------------------------

    def _parse(self, activation: bytes) -> Vector:
        """Validate a payload and read it as float32, or raise ``bad_activation``."""
        if not isinstance(activation, bytes | bytearray):
            raise ExecutorError(
                "bad_activation", f"activation must be bytes, got {type(activation).__name__}"
            )
        if len(activation) != self.activation_bytes:
            raise ExecutorError(
                "bad_activation",
                f"activation is {len(activation)} bytes; this model takes "
                f"{self.activation_bytes} ({self.hidden} little-endian float32)",
            )
        x = np.frombuffer(activation, dtype="<f4").astype(np.float32)
        if not bool(np.isfinite(x).all()):
            raise ExecutorError("bad_activation", "activation contains NaN or infinity")
        return x

    def _weights(self, model_id: str, layer: int) -> tuple[Matrix, Vector]:
        """Layer ``layer``'s ``(W, b)``, from the cache or regenerated from its seed."""
        key = (model_id, layer)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        # Generated outside the lock: two threads racing on one key compute identical
        # weights, so whichever lands in the cache last is equally correct.
        weights = self._generate(model_id, layer)
        with self._lock:
            self._cache[key] = weights
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_layers:
                self._cache.popitem(last=False)
        return weights

    def _generate(self, model_id: str, layer: int) -> tuple[Matrix, Vector]:
        entropy = [_LAYER_TAG, self.seed, *_digest_words(_utf8(model_id)), layer]
        rng = np.random.default_rng(entropy)
        d = self.hidden
        # Drawn in float64 and rounded once to float32: the draw order (W, then b) and
        # the rounding are fixed, so the weights depend on the seed words alone.
        w = rng.normal(0.0, 1.0 / math.sqrt(d), size=(d, d)).astype(np.float32)
        b = rng.normal(0.0, 0.1, size=d).astype(np.float32)
        w.flags.writeable = False  # shared by every request through the cache
        b.flags.writeable = False
        return w, b


def reference(
    model_id: str, layers: int, prompt: str, max_tokens: int, *, seed: int = 0, hidden: int = 64
) -> str:
    """The single-process answer any pipeline must reproduce: embed, all layers, decode."""
    model = ToyModel(seed=seed, hidden=hidden)
    activation = model.run(model_id, 0, layers, model.embed(model_id, prompt))
    return model.decode(model_id, layers, activation, max_tokens)
