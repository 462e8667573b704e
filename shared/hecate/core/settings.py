"""The checks a service's config struct runs on construction, and the error they raise.

Each service's settings are one validated struct in its own package (its
``config.py``), built by its ``hecate`` command from the flags, so a bad value stops the
service at start with the field's name rather than surfacing later as an odd decision.
Runtime objects (the logger, the tracer provider, the planning strategy) are passed
beside the config.
"""

from __future__ import annotations

from hecate.core.errors import HecateError

__all__ = ["BadConfig", "named", "positive"]


class BadConfig(HecateError, ValueError):
    """A setting out of its range: the message starts with the field's name. A
    ValueError too, so that msgspec reports it as a validation error when decoding."""

    code = "bad_config"


def named(value: str, field: str) -> None:
    if not value:
        raise BadConfig(f"{field}: must not be empty")


def positive(value: float, field: str, unit: str = "seconds") -> None:
    if not value > 0:  # also refuses NaN
        raise BadConfig(f"{field}: must be a positive number of {unit}, got {value!r}")
