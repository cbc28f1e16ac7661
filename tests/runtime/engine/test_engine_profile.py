"""The committed profile of the CPU engine loads into a latency model the simulator can use."""

from __future__ import annotations

from importlib import resources

from loom.perf.latency import ProfiledLatencyModel

PROFILE = resources.files("loom.perf") / "data/profiles/loom-tiny_cpu-vllm_tp1.csv"


def test_engine_profile_fits() -> None:
    text = PROFILE.read_text()
    assert "benchmarks/profile_engine.py" in text  # says how it was measured
    lat = ProfiledLatencyModel.load(str(PROFILE))
    assert lat.tp == 1 and lat.kv_capacity_tokens > 10_000
    one = lat.decode_step_time(1, 64)
    assert 1e-4 < one < 0.05  # milliseconds per step on a CPU
    assert lat.decode_step_time(64, 64 * 512) >= one
    assert lat.prefill_time(2048) > lat.prefill_time(128) > 0
