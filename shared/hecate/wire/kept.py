"""What a first stage tells routers its prefix store keeps (msgpack, node -> routers).
Re-exported by :mod:`hecate.wire.messages`.

A node hosting a model's first layers publishes :class:`PrefixNews` on
``hecate.node.<id>.kept`` when what it keeps changed, at most every
``--kept-pace-ms``: the prompt prefixes (by their text prints,
:mod:`hecate.model.prints`) newly kept with the tokens each holds, and those dropped.
Each news is numbered within the node's ``boot``; a router that missed one, or hears a
new boot, asks the node for :class:`PrefixState` (request/reply on
``hecate.node.<id>.kept.whole``), the whole of it as of a number, and follows the news
after it (:mod:`hecate_router.kept`). Every list is bounded where it is decoded. Both
say what a prompt position costs a layer there (``prefill_ms``).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from hecate.core.plan import Slug
from hecate.model.prints import MAX_KEPT, KeptPrint, ModelNews

__all__ = ["MAX_KEPT", "KeptPrint", "ModelNews", "PrefixNews", "PrefixState", "PrefixStateAsk"]

#: Models a node tells of in one message.
MAX_MODELS = 16

#: What a prompt position costs one layer on the node, in ms, as it measured its
#: prefill batches (None until one ran): a router's estimate of what a prefix kept
#: there spares, until it has timed the pipeline itself.
PrefillMs = Annotated[float, msgspec.Meta(ge=0, le=60_000)] | None


class PrefixNews(msgspec.Struct, frozen=True, kw_only=True):
    """What changed in a node's prefix stores since its news ``seq - 1`` of ``boot``."""

    node_id: Slug
    boot: Annotated[str, msgspec.Meta(max_length=64)]
    seq: Annotated[int, msgspec.Meta(ge=1, le=(1 << 63) - 1)]
    models: Annotated[list[ModelNews], msgspec.Meta(max_length=MAX_MODELS)] = []
    prefill_ms: PrefillMs = None
    # A reminder of the last number (nothing changed since, no models): a router that
    # missed the last news hears of it within the node's quiet time, not at its next.
    again: bool = False


class PrefixStateAsk(msgspec.Struct, frozen=True, kw_only=True):
    """A router asks a node for the whole of what it keeps."""


class PrefixState(msgspec.Struct, frozen=True, kw_only=True):
    """The whole of what a node keeps, as of its news ``seq`` of ``boot`` (0: before
    any): each model's ``kept`` only (``dropped`` empty)."""

    node_id: Slug
    boot: Annotated[str, msgspec.Meta(max_length=64)]
    seq: Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
    models: Annotated[list[ModelNews], msgspec.Meta(max_length=MAX_MODELS)] = []
    prefill_ms: PrefillMs = None
