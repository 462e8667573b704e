"""A service's flags, made from its config struct: the struct holds every default and
type once, and the command only names which fields it exposes and how to explain them.

A :class:`Flag` names a field (``"limits.gain"`` for a field of a nested struct) and its
help. Its name, type, choices and default come from the struct: ``max_attempts`` is
``--max-attempts``, an ``int`` whose default is the struct's; a ``Literal`` field takes
only its values; a ``bool`` is a switch. ``unit="ms"`` shows a field in seconds
(``stage_timeout_s``) as milliseconds (``--stage-timeout-ms``), the unit operators type.
:func:`config_from` turns the parsed flags back into the struct's fields, so a value
out of range is refused by the struct's own checks, naming the field.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec


@dataclass(frozen=True, slots=True)
class Flag:
    field: str  # the struct's field; "outer.inner" for a field of a nested struct
    help: str | None = None
    unit: Literal["", "ms"] = ""  # "ms": the flag in milliseconds, the field in seconds
    name: str | None = None  # the flag's name when it is not the field's

    @property
    def flag(self) -> str:
        if self.name is not None:
            return self.name
        leaf = self.field.rsplit(".", 1)[-1]
        if self.unit == "ms":
            leaf = leaf.removesuffix("_s") + "_ms"
        return "--" + leaf.replace("_", "-")

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


def _field(owner: type, name: str) -> tuple[msgspec.inspect.Type, Any]:
    """The type and default of field ``name`` of ``owner`` (a struct or a dataclass)."""
    info = msgspec.inspect.type_info(owner)
    fields = getattr(info, "fields", ())
    for f in fields:
        if f.name == name:
            if f.default is msgspec.NODEFAULT and f.default_factory is msgspec.NODEFAULT:
                raise TypeError(f"{owner.__name__}.{name} has no default to show")
            default = f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
            return f.type, default
    raise TypeError(f"{owner.__name__} has no field {name!r}")


def _resolve(config: type, path: str) -> tuple[msgspec.inspect.Type, Any]:
    owner: Any = config
    *outer, leaf = path.split(".")
    for name in outer:
        kind, _default = _field(owner, name)
        owner = getattr(kind, "cls", None)
        if owner is None:
            raise TypeError(f"{path}: {name} is not a struct")
    return _field(owner, leaf)


def add_flags(parser: argparse.ArgumentParser, config: type, flags: Sequence[Flag]) -> None:
    """One argument per flag, typed and defaulted by ``config``'s field."""
    for f in flags:
        kind, default = _resolve(config, f.field)
        shown = default * 1000 if f.unit == "ms" else default
        said = f"{shown:g}" if isinstance(shown, int | float) else str(shown)
        help_ = f"{f.help} (default {said})" if f.help else f"default {said}"
        if isinstance(kind, msgspec.inspect.BoolType):
            # A switch that is on by default is turned off by its --no- form.
            action = argparse.BooleanOptionalAction if default else "store_true"
            parser.add_argument(f.flag, action=action, default=default, help=f.help)
        elif isinstance(kind, msgspec.inspect.LiteralType):
            parser.add_argument(f.flag, choices=kind.values, default=default, help=help_)
        elif isinstance(kind, msgspec.inspect.IntType | msgspec.inspect.FloatType):
            number = float if f.unit == "ms" or isinstance(kind, msgspec.inspect.FloatType) else int
            parser.add_argument(f.flag, type=number, default=shown, help=help_)
        elif isinstance(kind, msgspec.inspect.StrType):
            parser.add_argument(f.flag, default=default, help=help_)
        else:
            raise TypeError(f"{f.field}: no flag for a field of type {kind!r}")


def config_from(args: argparse.Namespace, config: type, flags: Sequence[Flag], **fixed: Any) -> Any:
    """``config`` built from the parsed flags (and ``fixed``, what the command sets
    itself); a nested struct's flags replace those fields of its default."""
    values: dict[str, Any] = dict(fixed)
    nested: dict[str, dict[str, Any]] = {}
    for f in flags:
        value = getattr(args, f.dest)
        if f.unit == "ms":
            value = value / 1000
        outer, _, leaf = f.field.rpartition(".")
        if outer:
            nested.setdefault(outer, {})[leaf] = value
        else:
            values[leaf] = value
    for outer, fields in nested.items():
        _kind, default = _resolve(config, outer)
        if isinstance(default, msgspec.Struct):
            values[outer] = msgspec.structs.replace(default, **fields)
        else:
            values[outer] = dataclasses.replace(default, **fields)
    return config(**values)


def pipelines(text: str) -> int | Literal["auto"]:
    """A ``--pipelines`` value: a count of base replicas (at least 1), or ``auto``: two,
    then as many as the nodes can form once the other models have theirs
    (:class:`hecate.core.SwarmConfig`)."""
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of replicas or 'auto', got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 replica, got {value}")
    return value
