"""The gateway's settings: today's defaults, and a bad value refused at construction
with the field named."""

from __future__ import annotations

import msgspec
import pytest

from hecate_gateway.config import GatewayConfig


def test_the_defaults_are_what_hecate_gateway_starts_with() -> None:
    c = GatewayConfig()
    assert (c.host, c.port, c.timeout_s, c.grace_s) == ("127.0.0.1", 8000, 300.0, 10.0)
    assert (c.max_connections, c.header_timeout_s) == (1000, 10.0)


def test_settings_are_keyword_only_and_frozen() -> None:
    with pytest.raises(TypeError):
        GatewayConfig("0.0.0.0")  # type: ignore[call-arg]
    with pytest.raises(AttributeError):
        GatewayConfig().port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"host": ""}, "host"),
        ({"port": -1}, "port"),
        ({"port": 65536}, "port"),
        ({"timeout_s": 0.0}, "timeout_s"),
        ({"timeout_s": float("nan")}, "timeout_s"),
        ({"grace_s": 0.5}, "grace_s"),
        ({"max_connections": 0}, "max_connections"),
        ({"header_timeout_s": 0.0}, "header_timeout_s"),
        ({"header_timeout_s": float("nan")}, "header_timeout_s"),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=rf"^{named}: "):
        GatewayConfig(**fields)  # type: ignore[arg-type]
    # Decoded (from a file, say), the same check answers as a validation error.
    with pytest.raises(msgspec.ValidationError, match=named):
        msgspec.convert(fields, GatewayConfig)


def test_port_zero_asks_for_any_free_port() -> None:
    assert GatewayConfig(port=0).port == 0
