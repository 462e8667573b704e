"""What an operation in a chat template could make, bounded before it is made: where a
result could outgrow its operands by an amount the template's arguments choose (``'x' *
n``, ``center(n)``, ``replace``, ``join``, formats, ``**``), its size is checked against
the render's :class:`~hecate.llm.render_budget.Budget` first; and the filters and
values the sandbox routes through the budget (:mod:`hecate.llm.sandbox`).
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from hecate.llm.render_budget import MAX_INT_BITS, Budget, current

__all__ = [
    "build",
    "check_call",
    "check_format",
    "check_power",
    "check_printf",
    "check_repeat",
    "concat",
    "finalize",
    "iterate",
    "metered_filter",
]

# tojson's indent: the output grows by it per line per level.
_MAX_INDENT = 16
# Markup.striptags copies the whole string per tag it removes.
_QUADRATIC_CHARS = 32 * 1024
# At most what one format field writes beyond its argument and its written width (a
# float's digits, a number's grouping).
_FIELD_CHARS = 400

_T = TypeVar("_T")

_DIGITS = re.compile(r"\d+")


def _widths(text: str) -> int:
    """Every number written in a format, summed: no less than its widths and
    precisions (a format's own digits, beyond, only loosen the bound)."""
    total = 0
    for run in _DIGITS.findall(text):
        if len(run) > 12:
            return 10**12
        total += int(run)
    return total


def check_printf(budget: Budget, fmt: object, values: object) -> None:
    """``fmt % values``."""
    if isinstance(fmt, bytes):
        fmt = fmt.decode("latin-1")
    if not isinstance(fmt, str):
        return
    # A mapping's value may be written by every field; a tuple's each once.
    each = budget.weigh(values) if isinstance(values, Mapping) else 0
    stars = 0  # '*' takes a width from the values
    if "*" in fmt:
        given = values if isinstance(values, tuple) else (values,)
        stars = sum(abs(v) for v in given if isinstance(v, int))
    fields = fmt.count("%")
    chars = len(fmt) + _widths(fmt) + stars + budget.weigh(values)
    budget.bound(chars + fields * (_FIELD_CHARS + each), "a '%' format")


def check_format(budget: Budget, fmt: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``fmt.format(*args, **kwargs)``: any field may write any argument."""
    fields = 0
    for _text, field, spec, _conversion in string.Formatter().parse(fmt):
        if field is None:
            continue
        fields += 1
        if spec and "{" in spec:
            budget.refuse("a format field whose width is itself a field")
    given = budget.weigh(args) + budget.weigh(kwargs)
    budget.bound(len(fmt) + _widths(fmt) + fields * (_FIELD_CHARS + given), "a format")


def _check_replace(budget: Budget, s: Any, old: Any, new: Any, count: Any = None) -> None:
    if not (isinstance(s, str | bytes) and isinstance(old, type(s)) and isinstance(new, type(s))):
        return  # the call itself refuses mixed types
    hits = s.count(old) if old else len(s) + 1  # type: ignore[arg-type]
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    budget.bound(len(s) + hits * len(new), "replace()")


def _check_join(budget: Budget, sep: object, items: object) -> None:
    if isinstance(items, Sequence | Mapping | set | frozenset | str):
        chars = budget.weigh(items) + len(items) * budget.weigh(sep)
        budget.bound(chars, "join()")


def check_call(
    budget: Budget, obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...]:
    """A builtin method whose result's size its arguments choose; the arguments, with an
    iterator read out where the check needs its length."""
    owner = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", "")
    if isinstance(owner, str | bytes):
        first = args[0] if args else None
        if name in ("center", "ljust", "rjust", "zfill") and isinstance(first, int):
            budget.bound(first, f"{name}()")
        elif name == "expandtabs":
            size = first if args else kwargs.get("tabsize", 8)
            if isinstance(size, int):
                tabs = owner.count("\t" if isinstance(owner, str) else b"\t")  # type: ignore[arg-type]
                budget.bound(len(owner) + tabs * size, "expandtabs()")
        elif name == "replace" and len(args) >= 2:
            _check_replace(budget, owner, *args[:3])
        elif name == "join" and args:
            args = (budget.listed(first), *args[1:])
            _check_join(budget, owner, args[0])
        elif name == "translate" and isinstance(first, Mapping):
            longest = max((budget.weigh(v) for v in first.values()), default=1)
            budget.bound(len(owner) * max(longest, 1), "translate()")
        elif name == "striptags":
            _check_quadratic(budget, len(owner), "striptags()")
    elif isinstance(owner, int) and name == "to_bytes":
        length = args[0] if args else kwargs.get("length", 1)
        if isinstance(length, int):
            budget.bound(length, "to_bytes()")
    return args


def _check_quadratic(budget: Budget, chars: int, what: str) -> None:
    if chars > _QUADRATIC_CHARS:
        budget.refuse(
            f"{what} of {chars:,} characters, over {_QUADRATIC_CHARS:,} (its time is their square)"
        )


def check_repeat(budget: Budget, left: Any, right: Any) -> None:
    """``left * right``."""
    for seq, times in ((left, right), (right, left)):
        if isinstance(times, int) and times > 0 and isinstance(seq, str | bytes | list | tuple):
            chars = budget.weigh(seq, budget.limit // times + 1) * times if seq else 0
            budget.bound(chars, "'*'")
    if (
        isinstance(left, int)
        and isinstance(right, int)
        and (left.bit_length() + right.bit_length() > MAX_INT_BITS)
    ):
        budget.refuse(f"a product over {MAX_INT_BITS:,} bits")


def check_power(budget: Budget, base: Any, exponent: Any) -> None:
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and abs(base) > 1
        and base.bit_length() * exponent > MAX_INT_BITS
    ):
        budget.refuse(f"a power over {MAX_INT_BITS:,} bits")


# The filters whose results' sizes their arguments choose, checked with the filter's own
# parameters (after Jinja's context, environment or eval context, where it takes one),
# those the check does not read included: a template may pass any of them by position.


def _f_center(budget: Budget, value: Any, width: Any = 80) -> None:  # noqa: ARG001
    if isinstance(width, int):
        budget.bound(width, "center")


def _f_indent(budget: Budget, s: Any, width: Any = 4, *_: Any, **__: Any) -> None:
    pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    lines = s.count("\n") + 2 if isinstance(s, str) else budget.weigh(s)
    budget.bound(budget.weigh(s) + lines * pad, "indent")


def _f_wordwrap(budget: Budget, s: Any, *args: Any, wrapstring: Any = None, **_: Any) -> None:
    wrapstring = args[2] if len(args) > 2 else wrapstring  # (width, break_long_words, it)
    wrap = len(wrapstring) if isinstance(wrapstring, str) else 1
    chars = budget.weigh(s)
    budget.bound(chars + (chars + 1) * wrap, "wordwrap")


def _f_replace(budget: Budget, s: Any, old: Any, new: Any, count: Any = None) -> None:
    _check_replace(budget, str(s), str(old), str(new), count)


def _f_join(budget: Budget, value: Any, d: Any = "", *_: Any, **__: Any) -> None:
    _check_join(budget, d, value)


def _f_format(budget: Budget, value: Any, *args: Any, **kwargs: Any) -> None:
    check_printf(budget, value, kwargs or args)


def _f_batch(budget: Budget, value: Any, linecount: Any, fill_with: Any = None) -> None:  # noqa: ARG001
    if fill_with is not None and isinstance(linecount, int):
        budget.bound(linecount * (budget.weigh(fill_with) + 2), "batch")


def _f_slice(budget: Budget, value: Any, slices: Any, fill_with: Any = None) -> None:  # noqa: ARG001
    if isinstance(slices, int):
        budget.bound(slices * (budget.weigh(fill_with) + 4), "slice")


def _f_striptags(budget: Budget, value: Any) -> None:
    _check_quadratic(budget, budget.weigh(value), "striptags")


def _f_urlize(
    budget: Budget, value: Any, *args: Any, target: Any = None, rel: Any = None, **_: Any
) -> None:
    target = args[2] if len(args) > 2 else target  # (trim_url_limit, nofollow, target, rel)
    rel = args[3] if len(args) > 3 else rel
    chars = budget.weigh(value)  # a link at most every four characters, each wrapped
    extra = 64 + (budget.weigh(target) if target else 0) + (budget.weigh(rel) if rel else 0)
    budget.bound(3 * chars + (chars // 4 + 1) * extra, "urlize")


def _f_sum(budget: Budget, iterable: Any, attribute: Any = None, start: Any = 0) -> None:  # noqa: ARG001
    if not isinstance(start, int | float) and isinstance(iterable, Sequence):
        # Sums of lists copy the sum so far at each term.
        budget.bound(len(iterable) * (budget.weigh(iterable) + budget.weigh(start)), "sum")


def _f_tojson(budget: Budget, value: Any, indent: Any = None, *_: Any, **__: Any) -> None:  # noqa: ARG001
    pad = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
    if pad > _MAX_INDENT:
        budget.refuse(f"tojson's indent of {pad:,}, over {_MAX_INDENT}")


_FILTER_CHECKS: dict[str, Callable[..., None]] = {
    "center": _f_center,
    "indent": _f_indent,
    "wordwrap": _f_wordwrap,
    "replace": _f_replace,
    "join": _f_join,
    "format": _f_format,
    "batch": _f_batch,
    "slice": _f_slice,
    "striptags": _f_striptags,
    "urlize": _f_urlize,
    "sum": _f_sum,
    "tojson": _f_tojson,
}
_READ_OUT = {"join", "sum"}  # bounded by their iterable's length


def metered_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    check = _FILTER_CHECKS.get(name)
    skip = 0 if getattr(f, "jinja_pass_arg", None) is None else 1

    @functools.wraps(f)  # keeps jinja_pass_arg: Jinja passes the same context first
    def run(*args: Any, **kwargs: Any) -> Any:
        budget = current()
        args = tuple(budget.lazy(a) for a in args)
        if name in _READ_OUT and len(args) > skip:
            args = (*args[:skip], budget.listed(args[skip]), *args[skip + 1 :])
        if check is not None:
            check(budget, *args[skip:], **kwargs)
        return budget.admit(f(*args, **kwargs))

    return run


def iterate(value: Iterable[_T]) -> Iterator[_T]:
    return current().metered(value)


def build(value: _T) -> _T:
    return current().admit(value)


def concat(pieces: Iterable[str]) -> str:
    """Jinja's join of a render's, a macro's or a block's output."""
    budget = current()
    kept: list[str] = []
    chars = 0
    for piece in pieces:
        chars += len(piece)
        if chars > budget.limit:
            budget.refuse(f"output over {budget.limit:,} characters")
        kept.append(piece)
    return "".join(kept)


def finalize(value: _T) -> _T:
    """Each ``{{ ... }}`` written: a buffer's pieces are paid for as they are written."""
    budget = current()
    chars = len(value) if isinstance(value, str) else budget.weigh(value)
    budget.bound(chars, "an output")
    budget.spend(chars)
    return value
