"""A small, fixed set of saved benchmark results, shaped as the suites save them, for
rendering the report without running anything."""

# ruff: noqa: RUF001

from __future__ import annotations

import copy
from typing import Any


def envelope(suite: str, report: dict[str, Any]) -> dict[str, Any]:
    return {
        "suite": suite,
        "command": f"hecate bench {suite} --results build/bench",
        "machine": "x86_64 Test CPU, 2 cores, Linux 6.1, Python 3.11.7",
        "cores": 2,
        "date": "2026-01-02",
        "commit": "abc1234",
        "software": "nats-server 2.15.1, nats-py 2.16.0",
        "elapsed_s": 12.5,
        "report": copy.deepcopy(report),  # a test may change its copy, never the next test's
    }


def _pct(p50: float, p99: float) -> dict[str, float]:
    return {"p50": p50, "p99": p99}


CORE = {
    "route_us": {"2x3": _pct(0.61, 0.9), "8x4": _pct(0.625, 1.1), "32x6": _pct(0.63, 1.2)},
    "floor_us": {"2x3": _pct(0.2, 0.3), "8x4": _pct(0.2, 0.3), "32x6": _pct(0.2, 0.3)},
    "route_over_floor": {"2x3": 3.05, "8x4": 3.12, "32x6": 3.15},
    "route_inflight_us": {"2x3": _pct(1.3, 2), "8x4": _pct(2.1, 3), "32x6": _pct(4.4, 6)},
    "recost_us": {"2x3": _pct(8.1, 10), "8x4": _pct(26.0, 40), "32x6": _pct(125.0, 140)},
    "plan_ms": {"100": 0.1, "1000": 1.07, "10000": 16.9},
    "plan_ms_proportional": {"100": 0.24, "1000": 2.81, "10000": 41.3},
    "meta": {"batch": 50, "samples": 2000, "plan_repeats": 9},
}


def sweep_points(capacity: float) -> list[dict[str, Any]]:
    """Rates at half, at and past ``capacity``: the last two fail (a growing queue)."""
    points = []
    for fraction in (0.5, 1.0, 1.25, 1.5):
        offered = capacity * fraction
        overloaded = fraction > 1
        points.append(
            {
                "offered_rps": offered,
                "sent": int(offered),
                "ok": int(offered) - (7 if overloaded else 0),
                "failed": 0,
                "timed_out": 7 if overloaded else 0,
                "achieved_rps": capacity if overloaded else offered,
                "p50_us": 900.0 * fraction,
                "p99_us": 2_000_000.0 if overloaded else 3100.0 * fraction,
                "p99_capped": overloaded,
                "send_lag_p99_us": 410.0,
                "generators": 2,
                "served_in_full": not overloaded,
            }
        )
    return points


def _closed(rps: float) -> dict[str, float]:
    return {"rps": rps, "p50_us": 2400.0, "p99_us": 4800.0, "requests": rps, "failures": 0}


def _capacity(rps: float, lag_us: float = 410.0) -> dict[str, Any]:
    return {
        "rps": rps,
        "exact": lag_us <= 50_000,
        "failed_at_rps": rps * 1.25,
        "send_lag_p99_us_at_failure": lag_us,
    }


BUS = {
    "raw": _closed(26000.0),
    "routed_1": _closed(10920.0),
    "routed_3": _closed(5400.0),
    "routed_3_chain": _closed(6300.0),
    "routed_1_secure": _closed(9000.0),
    "sweep": {"raw": sweep_points(39000.0), "routed_1": sweep_points(10920.0)},
    "capacity": {
        "raw": _capacity(39000.0),
        "routed_1": _capacity(10920.0),
        "routed_3": _capacity(5400.0),
        "routed_3_chain": _capacity(6300.0),
        "routed_1_secure": _capacity(9282.0),
    },
    "ratio_1": 0.28,
    "ratio_1_is": "exact",
    "ratio_3": 0.138,
    "ratio_3_is": "exact",
    "ratio_3_chain": 0.162,
    "ratio_3_chain_is": "exact",
    "ratio_1_secure": 0.238,
    "ratio_1_secure_is": "exact",
    "secure_over_open": 0.85,
    "secure_over_open_is": "exact",
    "secure_over_open_met": True,
    "meta": {
        "inflight": 64,
        "seconds": 5.0,
        "rounds": 3,
        "layers": 3,
        "executor": "null",
        "ratio_basis": "open-loop capacity",
        "sweep": {
            "low": [0.1, 0.5],
            "start": 0.8,
            "step": 1.25,
            "misses": 2,
            "refine": 2,
            "ceiling": 20.0,
        },
        "sweep_seconds": 3.0,
        "sweep_timeout_s": 2.0,
        "generators": 2,
        "served_in_full": {"ok_share": 0.99, "p99_bound_ms": 100.0},
        "lagging_us": 50_000.0,
    },
}


def _policy(attempts: float, last: float) -> dict[str, float]:
    return {"attempts_per_success": attempts, "last_success_s": last}


HERD = {
    "policies": {
        "exact": _policy(5.5, 9.0),
        "seed": _policy(4.372, 9.66),
        "full": _policy(3.07, 16.88),
        "decorrelated": _policy(2.89, 17.06),
        "hecate": _policy(1.9, 9.0),
        "hecate-queue": {**_policy(1.0, 9.0), "successes": 1000, "refused": 0.0},
        "hecate-queue-5s": {**_policy(1.4, 9.42), "successes": 1000, "refused": 400.0},
    },
    "ideal_last_success_s": 9.0,
    "meta": {
        "clients": 1000,
        "rate_per_s": 100.0,
        "burst": 100.0,
        "seeds": 5,
        "queue_max_wait_ms": {"hecate-queue": 10_000, "hecate-queue-5s": 5_000},
    },
}

BREAKER = {
    "open_seen_ms": {"p50": 5.48, "p99": 7.59, "max": 61.2, "samples": 150, "expected": 150},
    "open_reject_us": 0.149,
    "meta": {"watchers": 3, "trips": 50},
}


def _cores(gateway: float) -> dict[str, float]:
    return {
        "gateway": gateway,
        "routers": 0.41,
        "nodes": 0.52,
        "nats-server": 0.3,
        "other services": 0.02,
        "load generators": 0.25,
    }


def _level(clients: int, rps: float, gateway: float) -> dict[str, Any]:
    return {
        "clients": clients,
        "rps": rps,
        "ok": int(rps * 4),
        "wrong": 0,
        "failed": 0,
        "cores": _cores(gateway),
        "rounds_rps": [rps, rps - 50, rps + 30],
    }


GATEWAY = {
    "toy": {
        "model": "ncm-base",
        "topology": "examples/swarm.json",
        "tokens": 8,
        "prompts": 8,
        "latency": {
            "direct_us": {"p50": 1210.0, "p99": 2950.0, "samples": 2000},
            "gateway_us": {"p50": 1830.5, "p99": 4100.0, "samples": 2000},
            "gateway_httpx_us": {"p50": 2850.0, "p99": 6300.0, "samples": 2000},
            "added_p50_us": 620.5,
            "added_p99_us": 1150.0,
            "added_p50_us_httpx": 1640.0,
            "added_p99_us_httpx": 3350.0,
            "wrong": {"direct": 0, "gateway": 0, "gateway_httpx": 0},
            "failed": {"direct": 0, "gateway": 0, "gateway_httpx": 0},
        },
        "capacity": {
            "direct": {
                "rps": 2420.0, "clients": 256, "growing": True,
                "levels": [_level(64, 1650.0, 0.0), _level(256, 2420.0, 0.0)],
            },
            "gateway": {
                "rps": 1150.0, "clients": 64, "growing": False,
                "levels": [_level(64, 1150.0, 0.97), _level(256, 1120.0, 0.99)],
            },
            "ratio_rounds": [0.477, 0.469, 0.481],
            "ratio": 0.477,
            "wrong": 0,
            "failed": 3,
            "clients": [64, 256],
            "processes": 2,
            "seconds": 4.0,
            "rounds": 3,
        },
    },
    "stream": {
        "model": "smollm2-135m",
        "prompt": "The capital of France is",
        "tokens": 48,
        "rounds": 5,
        "added_us": {"p50": 310.0, "p99": 820.0, "max": 1400.0, "samples": 240},
        "added_us_httpx": {"p50": 520.0, "p99": 1300.0, "max": 2100.0, "samples": 240},
        "unmatched": 0,
        "direct_tokens_per_s": 18.2,
        "gateway_tokens_per_s": 18.0,
        "gateway_httpx_tokens_per_s": 17.9,
        "direct_tokens_per_s_rounds": [18.2],
        "gateway_tokens_per_s_rounds": [18.0],
        "gateway_httpx_tokens_per_s_rounds": [17.9],
        "wrong": 0,
        "text": " Paris.",
    },
    "failed_checks": [],
}  # fmt: skip


def _speed(ttft: float, tps: float) -> dict[str, float]:
    return {"ttft_ms": ttft, "tokens_per_s": tps, "gap_ms": 1000 / tps}


def _steps(busy: float, paused: float) -> dict[str, float]:
    return {"busy_ms": busy, "after_pause_ms": paused}


LLM = {
    "single": _speed(100.1, 34.5),
    "stages_3": _speed(68.2, 28.7),
    "ratio_3_stages_rounds": [0.838, 0.788, 0.883],
    "ratio_3_stages_1_thread_rounds": [0.912, 0.871, 0.953],
    "stages_3_secure": _speed(69.0, 28.1),
    "secure_over_open_rounds": [0.979, 0.962, 0.991],
    "secure_over_open": 0.979,
    "secure_over_open_met": True,
    "single_1_thread": _speed(135.8, 25.8),
    "stages_1": _speed(73.4, 32.3),
    "stages_2": _speed(165.3, 21.6),
    "stages_3_hop": _speed(98.4, 21.8),
    "stages_3_1_thread": _speed(100.5, 22.7),
    "stage_steps_1_thread": _steps(8.69, 9.45),
    "stage_steps_2_threads": _steps(8.02, 9.48),
    "kill_between_steps": {**_speed(70.0, 27.0), "kill_stall_ms": 343.8, "failover_reason": "x"},
    "kill_mid_step": {**_speed(70.0, 27.0), "kill_stall_ms": 466.0, "failover_reason": "y"},
    "llama_cpp": None,
    "ratio_3_stages": 0.838,
    "ratio_3_stages_1_thread": 0.88,
    "meta": {"tokens": 48, "node_blas_threads": 2, "rounds": 3, "prompt": "The capital is"},
}


def _wan_run(rtt: float, dispatch: str, tps: float, gap: float) -> dict[str, Any]:
    return {
        "rtt_ms": rtt,
        "dispatch": dispatch,
        "tokens_per_s": tps,
        "rounds_tokens_per_s": [tps, tps + 0.4, tps - 0.3],
        "ttft_ms": 100.0 + 3 * rtt,
        "gap_ms": gap,
        "text_ok": True,
    }


WAN = {
    "runs": [
        _wan_run(0.0, "hop", 17.1, 57.6),
        _wan_run(20.0, "hop", 6.9, 134.6),
        _wan_run(40.0, "hop", 4.9, 198.3),
        _wan_run(0.0, "chain", 24.7, 41.3),
        _wan_run(20.0, "chain", 8.4, 117.7),
        _wan_run(40.0, "chain", 4.8, 205.4),
    ],
    "preference": {
        "rtt_ms": 40.0,
        "slow_pipeline": "smollm2-135m-r0",
        "fast_pipeline": "smollm2-135m-r1",
        "requests": 16,
        "warmup": 4,
        "on_fast": 14,
        "on_slow": 2,
        "tokens": 8,
        "text_ok": True,
        "target_share": 0.8,
        "share_fast": 0.875,
        "met": True,
    },
    "meta": {"tokens": 32, "rounds": 3, "node_blas_threads": 2, "prompt": "The capital is"},
}


def _timeline() -> dict[str, Any]:
    started = [i * 0.01 - 1.0 for i in range(300)]
    return {
        "faults": [[0.0, "SIGKILL node a1"], [1.5, "restart node a1"]],
        "started_s": started,
        "latency_ms": [4.0 + (250.0 if 0 <= s < 0.01 else 0.0) for s in started],
        "status": ["ok"] * 300,
    }


def _scenario(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "scenario": name,
        "sent": 10146,
        "ok": 10146,
        "errors": 0,
        "lost": 0,
        "wrong": 0,
        "p99_ms": 8.0,
        "max_ms": 254.0,
        "recover_s": 0.26,
        "baseline_p99_ms": 6.1,
        "error_codes": {},
        "faults": [],
        "checks": {},
        "notes": {"failover_events": 3.0},
        **extra,
    }


CHAOS = {
    "short": False,
    "timing": {"warm": 3.0, "fault": 4.0, "settle": 5.0},
    "scenarios": [
        _scenario("node-kill", timeline=_timeline()),
        _scenario(
            "sick-node",
            checks={"load_moved_off_slow_node": True, "breaker_opened": True},
            notes={
                "share_via_node_before": 0.533,
                "share_via_node_while_slow": 0.123,
                "failover_events": 4.0,
            },
        ),
        _scenario("nats-restart", wrong=2, checks={"plan_survived": True}),
        {"scenario": "llm-kill", "skipped": "its model is not pulled"},
    ],
}


def _step(compute: float, queue: float, node: float, bus: float, router: float) -> dict[str, Any]:
    parts = {"compute": compute, "queue": queue, "node": node, "bus": bus, "router": router}
    return {**parts, "token_ms": sum(parts.values())}


TOKENS = {
    "tokens": 48,
    "rounds": 3,
    "levels": {
        "1": {
            **_step(12.0, 0.1, 2.0, 3.0, 0.2),
            "steps": 141,
            "tokens_per_s": 57.0,
            "ms_per_token_per_user": 17.5,
            "wrong_texts": 0,
        },
        "16": {
            **_step(36.0, 4.0, 4.0, 8.0, 0.0),
            "steps": 2256,
            "tokens_per_s": 260.0,
            "ms_per_token_per_user": 61.5,
            "wrong_texts": 0,
        },
    },
}


RING = {
    "tokens": 48,
    "batch": 8,
    "groups": 3,
    "rounds": 3,
    "configs": {},
    "one_user_tokens_per_s": {
        "single": [80.0, 100.0, 90.0],
        "1 thread": [56.0, 64.0, 58.5],
        "2 threads, spin in runs": [72.0, 91.0, 81.0],
    },
    "one_user_over_single": {
        "1 thread": [0.7, 0.64, 0.65],
        "2 threads, spin in runs": [0.9, 0.91, 0.9],
    },
    "many_users_tokens_per_s": {
        "1 thread": [330.0, 340.0, 420.0],
        "2 threads, spin in runs": [210.0, 250.0, 240.0],
    },
    "wrong": [],
}


CONSTRAIN = {
    "tokens": 48,
    "rounds": 3,
    "mask": {"llguidance_ms": 0.02, "outlines_core_index_s": 0.04, "outlines_core_ms": 0.4},
    "tokens_per_s": {"free": [80.0, 78.0, 82.0], "schema": [76.0, 77.0, 70.0]},
    "schema_over_free": [0.95, 0.987, 0.854],
    "free_texts_equal": True,
    "invalid": [],
}


def _prefix_arm(reuse: bool, last_ms: float) -> dict[str, Any]:
    return {
        "prefix_reuse": reuse,
        "ttft_p50_ms_by_turn": [2800.0, 900.0, last_ms] if reuse else [9400.0, 8700.0, last_ms],
        "prompt_tokens": 30000,
        "prefill_tokens_computed": 5000 if reuse else 30000,
        "tokens_from_cache": 25000 if reuse else 0,
        "errors": 0,
        "error_examples": [],
        "wall_s": 36.0 if reuse else 140.0,
    }


PREFIX = {
    "users": 16,
    "turns": 3,
    "max_tokens": 12,
    "rounds": [
        {
            "on": _prefix_arm(True, 1300.0),
            "off": _prefix_arm(False, 6500.0),
            "last_turn_ttft_ratio": 0.2,
            "turns_that_differ": 0,
        },
        {
            "on": _prefix_arm(True, 1700.0),
            "off": _prefix_arm(False, 9300.0),
            "last_turn_ttft_ratio": 0.183,
            "turns_that_differ": 0,
        },
    ],
    "last_turn_ttft_ratios": [0.2, 0.183],
    "target": "TTFT p50 at turn 3 with reuse <= 0.5 of without",
    "verdict": "met",
    "failed_checks": [],
}


def _scale_level(nodes: int, hosts: int, rss: int, alive_s: float) -> dict[str, Any]:
    return {
        "nodes": nodes,
        "hosts": hosts,
        "alive": nodes,
        "formed": True,
        "all_alive_s": alive_s,
        "planned_nodes": nodes,
        "pipelines": nodes * 8 // 48,
        "planned_s": 1.0,
        "host_rss_mb": [rss] * hosts,
        "host_failures": [],
        "rss_per_node_mb": rss * hosts / nodes,
        "hosts_cpu_per_s": 0.1 * hosts,
        "host_cpu_us_per_node_per_s": 900.0,
        "telemetry_cpu_per_s": 0.02,
        "telemetry_cpu_us_per_beat": 40.0,
        "telemetry_rss_mb": 33,
        "snapshot_bytes": 127 * nodes,
        "snapshot_bytes_per_node": 127,
        "snapshot_updates_per_s": 2.0,
        "follow_bytes_per_s": 254 * nodes,
        "router_cpu_per_s": 0.02,
        "plan_bytes": 181 * nodes,
        "plans_published": 3,
        "routers": 1,
        "telemetry_shards": 1,
        "beats_expected_per_s": nodes,
        "beats_heard_per_s": [nodes],
        "beats_missed": 0,
        "server_cpu_per_s": 0.1,
        "shares_written": nodes,
        "beat_s": 1.0,
        "route_idle_us": {"p50": 1.5, "p99": 3.0},
        "route_measured_us": {"p50": 2.0, "p99": 4.0},
        "route_busy_us": {"p50": 18.0, "p99": 28.0},
        "snapshot_ms": 1.0,
    }


SCALE = {
    "levels": [
        _scale_level(100, 1, 58, 1.5),
        _scale_level(2000, 2, 186, 7.1),
        {**_scale_level(2000, 2, 186, 7.3), "routers": 10, "server_cpu_per_s": 0.4},
        {
            **_scale_level(2000, 2, 186, 7.0),
            "telemetry_shards": 2,
            "shard_cpu_per_s": [0.011, 0.012],
            "beats_expected_per_s": 2000,
            "beats_heard_per_s": [990, 1010],
            "telemetry_cpu_us_per_beat": 11.5,
            "snapshot_updates_per_s": 4.0,
            "follow_bytes_per_s": 127 * 2000 * 2,
        },
    ],
    "cutoff": {
        "nodes": 1000,
        "racks": 10,
        "cut": 100,
        "layers": 48,
        "heartbeat_ms": 1000,
        "telemetry_shards": 1,
        "at_once": 8,
        "formed": True,
        "formed_s": 21.0,
        "called_down": 100,
        "down_p50_s": 1.4,
        "down_p99_s": 1.9,
        "down_last_s": 1.95,
        "answered": 900,
        "wrong": 0,
        "failed": 0,
        "errors": [],
        "after_cut_requests": 600,
        "after_cut_p50_ms": 9.0,
        "after_cut_p99_ms": 1600.0,
        "repaired_s": 7.1,
        "plans_until_repaired": 1,
        "back_s": 4.2,
    },
    "rss_added_per_node_mb": 0.14,
    "meta": {
        "heartbeat_ms": 1000,
        "beat_budget_per_s": 2000,
        "most_ms": 10000,
        "per_host": 1000,
        "executor": "toy",
        "steady_s": 10.0,
        "cpu_count": 2,
    },
}


ENGINE: dict[str, Any] = {
    "rounds": 3,
    "steps": 24,
    "batch": 16,
    "threads": 2,
    "numpy_b1_ms": 28.5,
    "numpy_b1_tokens_per_s": 35.1,
    "numpy_b16_ms": 79.0,
    "numpy_b16_tokens_per_s": 202.5,
    "onnx_b1_ms": 9.8,
    "onnx_b1_tokens_per_s": 102.0,
    "onnx_b16_ms": 38.3,
    "onnx_b16_tokens_per_s": 417.5,
    "speedup_b1": 2.91,
    "speedup_b1_range": [2.8, 3.0],
    "speedup_b16": 2.06,
    "speedup_b16_range": [2.0, 2.1],
    "onnx_tokens_per_s_by_round": {"1": [101.0, 102.0, 99.0], "16": [410.0, 417.5, 420.0]},
    "onnx_batch_over_single_by_round": [4.06, 4.09, 4.24],
    "texts": {"numpy": " Paris.", "onnx": " Paris!", "llama_cpp": " Paris!"},
    "first_difference": 5,
    "llama_cpp": "llama-cpp-python 0.3.36, 2 threads",
    "llama_cpp_b1_ms": 10.41,
    "llama_cpp_b1_tokens_per_s": 96.1,
    "engine_over_llama_cpp_b1": 1.06,
    "engine_over_llama_cpp_b1_range": [0.98, 1.1],
    "engine_over_llama_cpp_by_round": [1.062, 0.98, 1.1],
    "first_difference_llama_cpp": None,
    "memory": {
        "whole_0_30": {"built_mib": 302, "sessions_mib": 333},
        "third_10_20": {"built_mib": 82, "sessions_mib": 91},
        "third_over_whole": 0.27,
    },
}

LONG: dict[str, Any] = {
    "rounds": 2,
    "tokens": 8,
    "prompt_tokens": 3989,
    "stages": [[0, 10], [10, 20], [20, 30]],
    "ttft_s": {"ahead": [4.1, 4.3], "one_chunk": [6.2, 6.0], "numpy": [21.0, 22.5]},
    "numpy_over_engine_by_round": [5.122, 5.233],
    "one_chunk_over_ahead_by_round": [1.512, 1.395],
    "engine_text_ok": True,
}


def _range(start: int, end: int, share: float, resident: float, peak: float) -> dict[str, Any]:
    target = round(1.15 * share + 200)
    return {
        "start": start, "end": end, "share_mib": share, "target_mib": target,
        "resident_mib": resident, "resident_x": round(resident / share, 2),
        "peak_mib": peak, "peak_x": round(peak / share, 2), "load_s": 1.5,
    }  # fmt: skip


def _node(node_id: str, layers: list[int] | None, peak: float) -> dict[str, Any]:
    return {
        "node_id": node_id, "limit_mib": 1536, "cgroup_max_mib": peak, "resident_mib": peak,
        "fit_layers": 10, "layers": layers, "oom_killed": False, "exit_code": None,
    }  # fmt: skip


MEMORY = {
    "target": "resident ≤ 1.15 × share + KV + 200 MiB, peak ≤ 1.25 × that",
    "threads": 2,
    "slots": 4,
    "cgroups": "",
    "models": [
        {
            "model": "llama-1b", "file": "llama-1b.gguf", "layers": 16, "file_mib": 626,
            "ranges": [_range(0, 16, 726, 1160, 1572), _range(0, 5, 265, 331, 443)],
            "llama_cpp": {"args": "-c 4096", "resident_mib": 791, "resident_x": 1.26,
                          "peak_mib": 791, "load_s": 1.8, "file_mib": 626, "kv_mib": 128},
            "met": False,
            "verdict": "not met: resident 1.25-1.60× share",
        }
    ],
    "pooled": [
        {
            "model": "llama-1b",
            "hecate": {
                "file": "llama-1b.gguf", "file_mib": 626, "nodes": 3, "limit_mib": 1536,
                "max_tokens": 64, "kv_positions": 4096,
                "refused": "layers 0-16 need 1.87 GiB; this node has 1.44 GiB (cgroup) for them",
                "load_s": 9.3, "tokens_per_s": {"1": 7.5, "4": 19.7},
                "per_round": {"1": [7.5, 7.4, 7.9], "4": [19.7, 20.1, 19.0]},
                "answers_equal": True,
                "node_use": [_node("n0", [0, 10], 852), _node("n1", [10, 16], 898),
                             _node("n2", None, 53)],
            },
            "llama_cpp": {
                "file": "llama-1b.gguf", "file_mib": 626, "servers": 3, "limit_mib": 1536,
                "max_tokens": 64, "load_s": 3.4, "tokens_per_s": {"1": 7.8, "4": 17.1},
                "per_round": {"1": [7.8, 7.1, 8.0], "4": [17.1, 16.0, 17.5]},
                "rpc": [{"port": 1, "limit_mib": 1536, "cgroup_max_mib": 261,
                         "resident_mib": 250, "oom_killed": False, "exit_code": None}],
            },
            "ratio": {"1": [0.96, 1.04, 0.99], "4": [1.15, 1.26, 1.09]},
            "speed_met": {"1": "undecided", "4": False},
            "met": False,
            "verdict": "not met: 0.99× at 1 users (undecided at 1.0×); 1.15× at 4 (below 1.5×)",
        }
    ],
    "speed": [
        {
            "model": "llama-1b", "threads": 2, "rounds": 3,
            "engine_tg": [17.0, 17.5, 16.8], "llama_tg": [40.0, 41.0, 39.0],
            "engine_pp": [90.0, 92.0, 88.0], "llama_pp": [100.0, 101.0, 99.0],
            "tg_ratio": [0.425, 0.427, 0.431], "pp_ratio": [0.9, 0.911, 0.889],
            "tg_met": False, "pp_met": False, "same_tokens": True,
        }
    ],
    "table": [],
}  # fmt: skip


def _type_speed(kind: str, tg: tuple[float, float, float], llama: float) -> dict[str, Any]:
    return {
        "type": kind, "model": "smollm2-135m", "file": f"smollm2-135m-{kind}.gguf",
        "file_mib": 258.3, "matrices": {kind: 211},
        "engine_tg": list(tg), "llama_tg": [llama] * 3,
        "engine_pp": [500.0, 520.0, 510.0], "llama_pp": [400.0] * 3,
        "tg_ratio": [round(t / llama, 3) for t in tg], "pp_ratio": [1.25, 1.3, 1.275],
        "others_cpu": [0.01, 0.0, 0.02], "same_tokens": True,
    }  # fmt: skip


TYPES = {
    "model": "smollm2-135m",
    "source_type": "Q4_1",
    "threads": 2,
    "rounds": 3,
    "target": "decode (tg128) on F16 ≥ 0.9× llama-bench's, same file and threads",
    "f16_at_least": 0.9,
    "quiet": 0.05,
    "retries": 2,
    "types": [
        _type_speed("F16", (19.0, 19.4, 18.6), 20.0),
        {**_type_speed("Q4_K_M", (80.0, 84.0, 82.0), 100.0),
         "matrices": {"Q5_0": 120, "Q4_K": 61, "Q8_0": 30}, "others_cpu": [0.0, 0.3, 0.01],
         "rerun": 2},
        {"type": "IQ4_NL", "model": "smollm2-135m",
         "failed": "llama-quantize: exit 1: unknown type"},
    ],
    "gemma": {
        "type": "Q4_K_M", "model": "gemma3-270m", "file": "/models/gemma-3-270m-q4_k_m.gguf",
        "file_mib": 241.4, "matrices": {"Q5_0": 81, "Q4_K": 27},
        "failed": "exit 1: UnsupportedModel: gemma3: no sliding window",
    },
    "f16_met": True,
    "table": [],
    "skipped": None,
}  # fmt: skip


def results(*, llm: bool = True) -> dict[str, dict[str, Any]]:
    """Every suite's saved result (``llm=False``: the model suite never ran)."""
    out = {
        "scale": envelope("scale", SCALE),
        "core": envelope("core", CORE),
        "bus": envelope("bus", BUS),
        "herd": envelope("herd", HERD),
        "breaker": envelope("breaker", BREAKER),
        "gateway": envelope("gateway", GATEWAY),
        "chaos": {**envelope("chaos", CHAOS), "command": "hecate chaos all --results build"},
        "memory": envelope("memory", MEMORY),
        "types": envelope("types", TYPES),
    }
    if llm:
        out["llm"] = envelope("llm", LLM)
        out["engine"] = envelope("engine", ENGINE)
        out["long"] = envelope("long", LONG)
        out["tokens"] = envelope("tokens", TOKENS)
        out["ring"] = envelope("ring", RING)
        out["constrain"] = envelope("constrain", CONSTRAIN)
        out["prefix"] = envelope("prefix", PREFIX)
        out["wan"] = envelope("wan", WAN)
    return out
