"""What an engine may take of its machine, as the node's environment says: its threads
(``HECATE_ENGINE_THREADS``) and the KV positions a range keeps (``HECATE_KV_POSITIONS``).
Each refused, naming it, when it is not a number it can be."""

from __future__ import annotations

import os
from collections.abc import Mapping

from hecate.core.errors import HecateError


def engine_threads(env: Mapping[str, str] = os.environ) -> int | None:
    """``HECATE_ENGINE_THREADS``: the engine's threads in this process (``hecate up``
    gives each node one, as its nodes share the machine's cores); None, unset: every
    core. A value that is not a positive whole number is refused, naming it."""
    text = env.get("HECATE_ENGINE_THREADS", "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise HecateError(f"HECATE_ENGINE_THREADS: expected a positive whole number, got {text!r}")
    return int(text)


#: The positions of KV a range keeps for its sessions at most, unless
#: ``HECATE_KV_POSITIONS`` says otherwise: four sessions of 4,096 positions (or two of
#: 8,192). A node budgets its memory for them; past them, the least recently used
#: sessions' caches go.
KV_POSITIONS = 16384


def kv_positions(env: Mapping[str, str] = os.environ) -> int:
    """``HECATE_KV_POSITIONS``, else :data:`KV_POSITIONS`; a value that is not a
    whole number from 1 to 2**24 is refused, naming it."""
    text = env.get("HECATE_KV_POSITIONS", "").strip()
    if not text:
        return KV_POSITIONS
    if not text.isdigit() or not 1 <= int(text) <= 1 << 24:
        raise HecateError(
            f"HECATE_KV_POSITIONS: expected a whole number from 1 to 2**24, got {text!r}"
        )
    return int(text)
