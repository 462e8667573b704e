"""The sandbox a GGUF's chat template runs in: Jinja2's immutable sandbox (it may read
what it is given and nothing else), with each loop's iterable, each value the template
builds, each call, each arithmetic operation and each output routed through the
render's budget (:mod:`hecate.llm.render_budget`, :mod:`hecate.llm.render_checks`).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from typing import Any, NoReturn

from jinja2 import TemplateError, nodes
from jinja2.runtime import Context, LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from hecate.llm.render_budget import current
from hecate.llm.render_checks import (
    build,
    check_call,
    check_format,
    check_power,
    check_printf,
    check_repeat,
    concat,
    finalize,
    iterate,
    metered_filter,
)

__all__ = ["Meter", "Refused", "environment"]

# Jinja calls these at compile time to fold constants; that they raise there leaves
# the work to the render. The names cannot be written in a template.
ITERATE = "(metered iteration)"
BUILD = "(metered value)"


class Refused(TemplateError):
    """The template's own ``raise_exception``."""


class Meter(NodeTransformer):
    """Routes each loop's iterable (and so every nested loop's iterations), and each
    list, tuple, dict and ``~`` the template builds, through the budget: the sandbox
    sees calls, attributes and arithmetic, not these."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _through(ITERATE, node.iter)  # type: ignore[arg-type]
        return node

    def visit_List(self, node: nodes.Expr) -> nodes.Node:
        self.generic_visit(node)
        return _through(BUILD, node)

    visit_Dict = visit_Concat = visit_List

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Node:
        self.generic_visit(node)
        return _through(BUILD, node) if node.ctx == "load" else node


def _through(name: str, node: nodes.Expr) -> nodes.Filter:
    return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(("+", "-", "*", "%", "**"))

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = current()
        budget.step()
        if isinstance(obj, LoopContext) and args:  # a recursive loop's next level
            args = (budget.metered(args[0]), *args[1:])
        args = tuple(budget.lazy(a) for a in args)
        kwargs = {k: budget.lazy(v) for k, v in kwargs.items()}
        args = check_call(budget, obj, args, kwargs)
        return budget.admit(super().call(context, obj, *args, **kwargs))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        budget = current()
        if operator == "*":
            check_repeat(budget, left, right)
        elif operator == "**":
            check_power(budget, left, right)
        elif operator == "%":
            check_printf(budget, left, right)
        return budget.admit(super().call_binop(context, operator, left, right))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        run = super().wrap_str_format(value)
        if run is None:
            return None
        fmt: str = value.__self__
        mapped = value.__name__ == "format_map"

        @functools.wraps(run)
        def checked(*args: Any, **kwargs: Any) -> str:
            check_format(current(), fmt, args[:1] if mapped else args, {} if mapped else kwargs)
            return run(*args, **kwargs)

        return checked


def _refuse(message: str) -> NoReturn:
    raise Refused(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _strftime_now(fmt: str) -> str:
    # time.strftime writes up to 256 times its format's length (glibc pads to any width)
    current().bound(256 * len(fmt), "strftime_now")
    return time.strftime(fmt)


def environment() -> _Sandbox:
    env = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols"],
        finalize=finalize,
    )
    env.concat = concat  # type: ignore[method-assign]
    env.filters["tojson"] = _tojson
    env.filters = {name: metered_filter(name, f) for name, f in env.filters.items()}
    env.filters[ITERATE] = iterate
    env.filters[BUILD] = build
    env.globals["raise_exception"] = _refuse
    env.globals["strftime_now"] = _strftime_now  # Llama 3's templates date the prompt
    del env.globals["lipsum"]  # writes as many paragraphs as asked, in one call
    return env
