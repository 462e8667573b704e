"""The planner's, telemetry's and breaker's settings: checked once, at construction."""

from __future__ import annotations

import math
from collections.abc import Callable

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate.core import SwarmConfig
from hecate.core.settings import BadConfig
from hecate.core.telemetry import DEFAULT_ALPHA
from hecate.resilience.breaker import BreakerConfig as CircuitConfig
from hecate_breaker.config import BreakerConfig
from hecate_breaker.quotas import QuotaConfig
from hecate_planner.config import PlannerConfig
from hecate_telemetry.config import TelemetryConfig
from hecate_telemetry.liveness import LivenessConfig

SWARM = SwarmConfig(12, 2)


def test_the_defaults_are_the_commands_defaults() -> None:
    planner = PlannerConfig(swarm=SWARM)
    assert (planner.instance_id, planner.settle_s) == ("planner", 0.5)
    telemetry = TelemetryConfig()
    assert (telemetry.missed, telemetry.publish_s, telemetry.alpha) == (3, 0.1, DEFAULT_ALPHA)
    assert telemetry.liveness == LivenessConfig()
    breaker = BreakerConfig()
    assert breaker.circuit() == CircuitConfig(probe_timeout_s=10.0)
    assert breaker.quotas == QuotaConfig()


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: PlannerConfig(swarm=SWARM, settle_s=0.0), "settle_s"),
        (lambda: PlannerConfig(swarm=SWARM, instance_id=""), "instance_id"),
        (lambda: TelemetryConfig(missed=-1), "missed"),
        (lambda: TelemetryConfig(publish_s=math.nan), "publish_s"),
        (lambda: TelemetryConfig(alpha=1.5), "alpha"),
        (lambda: BreakerConfig(failure_threshold=0), "failure_threshold"),
        (lambda: BreakerConfig(window_s=-1.0), "window_s"),
        (lambda: BreakerConfig(cooldown_s=0.0), "cooldown_s"),
        (lambda: BreakerConfig(probe_timeout_s=0.0), "probe_timeout_s"),
    ],
)
def test_a_bad_value_is_refused_with_its_field_named(
    build: Callable[[], object], field: str
) -> None:
    with pytest.raises(BadConfig, match=f"^{field}: "):
        build()


def test_a_bad_value_in_a_decoded_config_is_a_validation_error() -> None:
    with pytest.raises(msgspec.ValidationError, match="cooldown_s"):
        msgspec.json.decode(b'{"cooldown_s": -1}', type=BreakerConfig)


def test_the_configs_are_frozen() -> None:
    with pytest.raises(AttributeError):
        BreakerConfig().window_s = 1.0  # type: ignore[misc]


@given(missed=st.integers(0, 100), alpha=st.floats(0.0, 1.0, exclude_min=True))
def test_telemetry_always_allows_missed_intervals_of_silence(missed: int, alpha: float) -> None:
    config = TelemetryConfig(missed=missed, alpha=alpha)
    assert config.detector().min_missed == float(missed)
    assert msgspec.structs.replace(config.detector(), min_missed=0.0) == LivenessConfig()


@given(
    threshold=st.integers(1, 1000),
    seconds=st.tuples(*[st.floats(1e-3, 1e6)] * 3),
)
def test_the_breaker_runs_its_circuits_on_exactly_its_settings(
    threshold: int, seconds: tuple[float, float, float]
) -> None:
    window, cooldown, probe = seconds
    config = BreakerConfig(
        failure_threshold=threshold, window_s=window, cooldown_s=cooldown, probe_timeout_s=probe
    )
    assert config.circuit() == CircuitConfig(
        failure_threshold=threshold, window_s=window, cooldown_s=cooldown, probe_timeout_s=probe
    )
