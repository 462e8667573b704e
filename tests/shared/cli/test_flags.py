"""A service's flags come from its config struct (hecate.cli.flags): every default and
type is the struct's, a flag in milliseconds is the field in seconds, and the parsed
flags build the struct back, checked by it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

import msgspec
import pytest

from hecate.cli.flags import Flag, add_flags, config_from
from hecate.core import FailoverOptions
from hecate_router.cli import FLAGS as ROUTER_FLAGS
from hecate_router.config import RouterConfig


@dataclass(frozen=True)
class Inner:
    gain: float = 2.0
    floor: int = 1


class Config(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    attempts: int = 3
    timeout_s: float = 1.5
    mode: Literal["hop", "chain"] = "hop"
    strict: bool = False
    inner: Inner = Inner()

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts: must be at least 1, got {self.attempts}")


FLAGS = (
    Flag("attempts", "tries"),
    Flag("timeout_s", "how long", unit="ms"),
    Flag("mode"),
    Flag("strict"),
    Flag("inner.gain", name="--inner-gain"),
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_flags(p, Config, FLAGS)
    return p


def test_names_types_and_defaults_come_from_the_struct() -> None:
    args = parser().parse_args([])
    assert (args.attempts, args.timeout_ms, args.mode, args.strict, args.inner_gain) == (
        3,
        1500.0,
        "hop",
        False,
        2.0,
    )
    assert config_from(args, Config, FLAGS, name="x") == Config(name="x")


def test_parsed_flags_build_the_struct_back_in_its_units() -> None:
    argv = ["--attempts", "5", "--timeout-ms", "250", "--mode", "chain", "--strict"]
    args = parser().parse_args([*argv, "--inner-gain", "3"])
    config = config_from(args, Config, FLAGS, name="x")
    assert config == Config(
        name="x", attempts=5, timeout_s=0.25, mode="chain", strict=True, inner=Inner(gain=3.0)
    )


def test_a_literal_takes_only_its_values_and_a_bad_value_is_the_struct_s_to_refuse() -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--mode", "sideways"])
    args = parser().parse_args(["--attempts", "0"])
    with pytest.raises(ValueError, match="attempts: must be at least 1"):
        config_from(args, Config, FLAGS, name="x")


def test_hecate_router_s_defaults_are_router_config_s() -> None:
    p = argparse.ArgumentParser()
    add_flags(p, RouterConfig, ROUTER_FLAGS)
    failover = FailoverOptions()
    built = config_from(
        p.parse_args([]), RouterConfig, ROUTER_FLAGS, instance_id="r", failover=failover
    )
    assert built == RouterConfig(instance_id="r", failover=failover)
    # ...and the lifecycle's own defaults are the router's, declared once.
    assert built.flow() == RouterConfig(instance_id="r").flow()
