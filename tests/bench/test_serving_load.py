"""The serving load generator as the ROSE benchmark uses it: a window of the bursty serving
day replayed through co-serving emulated engines (a prefiller, two decoders) gives the
simulator's serving latencies for the same window; the window and bad settings are checked."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

import numpy as np
import pytest

from loom.bench.serving_load import replay, window
from loom.core.errors import ConfigError
from loom.experiments import rose_steps as steps
from loom.rollout.rose.scheduler import ROSE_ROUTERS, RoutingKind
from loom.runtime.emulate import EmulatedProcess
from loom.sim.workloads.rose import ROSE_WORKLOADS
from loom.sim.workloads.serving import synthetic_day

SCALE = 0.1


def test_a_served_window_of_the_serving_day_matches_the_simulator() -> None:
    wl = ROSE_WORKLOADS["8b"]
    day = synthetic_day(mean_rps=3.0, seed=1)
    offset, horizon = steps.DAY_OFFSET_S, 60.0
    reqs = window(day, offset, horizon)
    assert len(reqs) > 100 and all(0 <= at < horizon for at, _, _ in reqs)
    sim = steps._simulation(
        wl,
        (),
        router=ROSE_ROUTERS.get(RoutingKind.ROSE)(),
        dedicated_tp=(),
        lent=steps.lent_instances(wl, replace(steps.ROSE, lent_gpus=3)),  # 1 prefill : 2 decode
        serving=day,
        serving_offset_s=offset,
        serving_horizon_s=horizon,
    ).run()
    args = ("--coserve", wl.serving_model, "--time-scale", str(SCALE), "--role")
    with contextlib.ExitStack() as stack:
        pre, *dec = (
            stack.enter_context(EmulatedProcess("qwen3-8b@h800", *args, role))
            for role in ("prefill", "decode", "decode")
        )
        out = asyncio.run(
            replay(reqs, wl.serving_model, [pre.url], [d.url for d in dec], time_scale=SCALE)
        )
    assert out.failures == [] and len(sim.ttft_s) == len(reqs)
    for served, simulated in ((out.ttft_s, sim.ttft_s), (out.tpot_s, sim.tpot_s)):
        assert np.median(served) == pytest.approx(np.median(simulated), rel=0.1)
    summary = out.summary(wl.slo_ttft_s, wl.slo_tpot_s)
    assert summary["ttft_attainment"] == summary["tpot_attainment"] == 1.0


def test_bad_serving_settings_are_refused() -> None:
    day = synthetic_day(mean_rps=1.0, seed=1, hours=1.0)
    with pytest.raises(ConfigError, match="horizon_s"):
        window(day, 0.0, 0.0)
    with pytest.raises(ConfigError, match="prefill"):
        asyncio.run(replay([(0.0, 1, 1)], "m", [], ["http://x"], time_scale=1.0))
    with pytest.raises(ConfigError, match="time_scale"):
        asyncio.run(replay([(0.0, 1, 1)], "m", ["http://x"], ["http://y"], time_scale=0.0))
