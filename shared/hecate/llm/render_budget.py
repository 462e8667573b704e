"""A chat template render's budget: what one render may still spend, in steps (loop
iterations and calls), characters built and written, and wall clock (see
:mod:`hecate.llm.template`). The render in progress holds its :class:`Budget` in
:data:`BUDGET`; the sandbox's hooks (:mod:`hecate.llm.sandbox`) spend from it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import ItemsView, Iterable, Iterator, KeysView, ValuesView
from contextvars import ContextVar
from typing import NoReturn, TypeVar

from jinja2.runtime import LoopContext
from jinja2.utils import Namespace

__all__ = [
    "BUDGET",
    "CHARS_PER_INPUT",
    "MAX_CHARS",
    "MAX_INT_BITS",
    "MAX_STEPS",
    "RENDER_SECONDS",
    "WORK_PER_CHAR",
    "Budget",
    "Overrun",
    "current",
]

#: Wall clock a render may take; real templates take well under 10 ms.
RENDER_SECONDS = 2.0
#: Loop iterations (every nested loop's counted) and calls a render may make in all.
MAX_STEPS = 1_000_000
#: The longest output, and value, any render may make: this or CHARS_PER_INPUT times the
#: characters of its messages and tools, whichever is more.
MAX_CHARS = 1 << 20
CHARS_PER_INPUT = 8
#: Characters a render may build in all (garbage included), per character of that limit:
#: a loop that keeps building fresh strings into a macro's buffer is stopped by this.
WORK_PER_CHAR = 64
#: The largest integer a render may make (Python's are unbounded; a product doubles).
MAX_INT_BITS = 4096
# Containers at least this long have their weights kept, this many at most.
_KEPT_LENGTH = 32
_KEPT_WEIGHTS = 4096

_T = TypeVar("_T")


class Overrun(Exception):
    """A render past its budget; the message names the limit."""


class Budget:
    """What one render may still spend."""

    __slots__ = ("_known", "deadline", "limit", "over", "steps", "work")

    def __init__(self, size: int) -> None:
        self.deadline = time.monotonic() + RENDER_SECONDS
        self.steps = MAX_STEPS
        self.limit = max(MAX_CHARS, CHARS_PER_INPUT * size)
        self.work = WORK_PER_CHAR * self.limit
        self.over = ""
        # Long containers' weights, kept with them (an id is not reused while its object
        # lives): a template that builds a value holding the messages at every step has
        # them weighed once.
        self._known: dict[int, tuple[object, int]] = {}

    def refuse(self, reason: str) -> NoReturn:
        # A limit once hit stays hit: were the error caught on its way out (nothing in
        # Jinja's runtime catches it today), the render's next step raises it again.
        self.over = self.over or reason
        raise Overrun(self.over)

    def step(self) -> None:
        """One loop iteration or call; the clock is read here, as any long render steps
        often (what it does between steps is bounded by its source and the limit)."""
        if self.over:
            raise Overrun(self.over)
        self.steps -= 1
        if self.steps < 0:
            self.refuse(f"over {MAX_STEPS:,} steps (loop iterations and calls)")
        if time.monotonic() > self.deadline:
            self.refuse(f"over {RENDER_SECONDS:g} s")

    def spend(self, chars: int) -> None:
        self.work -= chars
        if self.work < 0:
            self.refuse(f"over {WORK_PER_CHAR * self.limit:,} characters built")

    def bound(self, chars: int, what: str) -> None:
        if chars > self.limit:
            self.refuse(f"{what} of {chars:,} characters, over {self.limit:,}")

    def weigh(self, value: object, cap: int | None = None) -> int:
        """About how many characters ``value`` writes as text (a container's repr): a
        value held many times over counts each time, as its repr writes it each time.
        Counted no further than just past ``cap`` (the limit), each container walked
        once: a list doubled on itself sixty times is weighed in sixty steps."""
        if isinstance(value, str | bytes | bytearray):
            return len(value)
        return self._weigh(value, self.limit if cap is None else cap, {})

    def _weigh(self, value: object, cap: int, seen: dict[int, int]) -> int:
        if isinstance(value, str | bytes | bytearray):
            return len(value)
        if value is None or isinstance(value, bool):
            return 5
        if isinstance(value, int):
            return value.bit_length() // 3 + 2
        if isinstance(value, float):
            return 24
        if isinstance(value, KeysView | ValuesView | ItemsView):
            mapping = getattr(value, "mapping", None)  # a dict's view writes the dict
            return 64 if mapping is None else self._weigh(mapping, cap, seen)
        # Within one walk, every container it reaches lives: an id names one of them.
        # One counted past its cap makes the whole walk's count past the cap too.
        key = id(value)
        if (weight := seen.get(key)) is not None:
            return weight
        if isinstance(value, Namespace):  # its attributes change: never kept
            attrs = object.__getattribute__(value, "_Namespace__attrs")
            seen[key] = weight = 12 + self._walk(attrs, cap, seen)
            return weight
        if not isinstance(value, list | tuple | dict | set | frozenset):
            return 64  # a macro, an iterator, an undefined: a short repr
        if (known := self._known.get(key)) is not None:
            return known[1]
        seen[key] = weight = self._walk(value, cap, seen)
        if weight <= cap and len(value) >= _KEPT_LENGTH and len(self._known) < _KEPT_WEIGHTS:
            self._known[key] = (value, weight)  # counted whole, and kept alive with it
        return weight

    def _walk(self, container: Iterable[object], cap: int, seen: dict[int, int]) -> int:
        total = 2
        for item in items_of(container):
            total += self._weigh(item, cap - total, seen) + 2
            if total > cap:
                break
        return total

    def admit(self, value: _T) -> _T:
        """``value``, made by the template: no longer than the limit, and paid for."""
        if isinstance(value, str):  # most of what a template makes
            self.bound(len(value), "a value")
            self.spend(len(value))
            return value
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            self.refuse(f"a number of {value.bit_length():,} bits, over {MAX_INT_BITS:,}")
        self.bound(self.weigh(value), "a value")
        sized = isinstance(value, str | bytes | list | tuple | dict | set | frozenset)
        self.spend(len(value) if sized else 1)  # type: ignore[arg-type]
        return value

    def metered(self, iterable: Iterable[_T]) -> Iterator[_T]:
        for item in iterable:
            self.step()
            yield item

    def lazy(self, value: _T) -> _T:
        """An iterator given to a call or filter, counted as it is consumed."""
        if isinstance(value, Iterator) and not isinstance(value, LoopContext):
            return self.metered(value)  # type: ignore[return-value]
        return value

    def listed(self, value: _T) -> _T:
        """An iterator given where its length bounds the result, read out first."""
        return list(value) if isinstance(value, Iterator) else value  # type: ignore[return-value]


def items_of(value: Iterable[object]) -> Iterable[object]:
    """A container's items; a dict's keys and values."""
    return itertools.chain.from_iterable(value.items()) if isinstance(value, dict) else value


BUDGET: ContextVar[Budget | None] = ContextVar("template_budget", default=None)


def current() -> Budget:
    budget = BUDGET.get()
    if budget is None:
        raise RuntimeError("a chat template's code runs only within a render")
    return budget
