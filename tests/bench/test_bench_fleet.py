"""The fleet launcher: each kind starts its engines, they answer, and after the block nothing
it started is left running, also when a start fails halfway."""

from __future__ import annotations

import contextlib
from pathlib import Path

import httpx
import pytest
from bench_rig import below_me, left_running

from loom.bench.fleet import (
    ENGINE_COUNTERS,
    TINY_PROFILE,
    EmulatedEngines,
    RunningEngines,
    StandinEngines,
    VllmEngines,
)
from loom.runtime.engine import INSTALL_HINT, engine_available


def test_standin_engines_answer_and_leave_nothing_running() -> None:
    before = below_me()
    with StandinEngines(2, "--step-ms", "1") as fleet:
        assert len(set(fleet.urls)) == 2
        for url in fleet.urls:
            assert httpx.get(url + "/health", timeout=10).status_code == 200
        assert fleet.model_name()
        assert len(fleet.pids()) == 2 and fleet.counters() == {}
        assert fleet.time_scale == 1.0 and fleet.profiles() == ()
        setup = fleet.router_setup(max_running=4, queue=1, settings={"refit_every": 9})
        assert (setup.max_running, setup.queue, setup.tp, setup.priority) == (4, 1, 1, False)
        assert dict(setup.settings) == {"refit_every": 9} and setup.model is None
        urls = list(fleet.urls)
    assert fleet.urls == []
    assert left_running(before) == {}
    for url in urls:
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=2)


def test_emulated_engines_answer_count_and_leave_nothing_running() -> None:
    before = below_me()
    with EmulatedEngines("qwen3-14b@h100:tp2", 2, time_scale=0.01, max_running=8) as fleet:
        assert len(fleet.urls) == 2 and fleet.time_scale == 0.01
        assert fleet.model_name() == httpx.get(fleet.urls[1] + "/v1/models").json()["data"][0]["id"]
        counts = fleet.counters()
        assert set(counts) == set(ENGINE_COUNTERS) and all(v == 0 for v in counts.values())
        setup = fleet.router_setup(max_running=1024)
        assert (setup.tp, setup.priority, setup.model, setup.gpu) == (2, True, "qwen3-14b", "h100")
        assert "emulated engines qwen3-14b@h100:tp2, time scale 0.01" in fleet.describe()
        assert len(below_me() - before) >= 2
    assert left_running(before) == {}


class _HalfStarted(StandinEngines):
    """Starts its engines, then fails."""

    def _start(self, stack: contextlib.ExitStack) -> None:
        super()._start(stack)
        raise RuntimeError("the third engine did not start")


def test_a_fleet_that_fails_to_start_stops_what_it_started() -> None:
    before = below_me()
    fleet = _HalfStarted(2)
    with pytest.raises(RuntimeError, match="third engine"), fleet:
        pass
    assert fleet.urls == []
    assert left_running(before) == {}


def test_running_engines_start_and_stop_nothing(standins: StandinEngines) -> None:
    before = below_me()
    with RunningEngines([u + "/" for u in standins.urls], profiles=(Path("p.csv"),)) as fleet:
        assert fleet.urls == standins.urls
        assert fleet.pids() == [] and fleet.profiles() == (Path("p.csv"),)
        assert fleet.router_setup(max_running=2).profiles == (Path("p.csv"),)
    assert below_me() == before
    assert httpx.get(standins.urls[0] + "/health", timeout=10).status_code == 200


def test_a_fleet_needs_an_engine() -> None:
    with pytest.raises(ValueError, match="at least one"):
        StandinEngines(0)
    with pytest.raises(ValueError, match="at least one URL"):
        RunningEngines([])
    with pytest.raises(ValueError, match="time_scale must be > 0"):
        EmulatedEngines("qwen3-14b@h100", 1, time_scale=0)


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.skipif(
    not engine_available(), reason=f"needs the cpu-engine extra (vLLM's CPU build): {INSTALL_HINT}"
)
def test_vllm_engines_answer_and_leave_nothing_running() -> None:
    before = below_me()
    with VllmEngines(1, max_running=2) as fleet:
        assert fleet.model_name() == "loom-tiny"
        assert fleet.profiles() == (TINY_PROFILE,) and TINY_PROFILE.exists()
        assert fleet.router_setup(max_running=2).profiles == (TINY_PROFILE,)
        body = {"model": "loom-tiny", "prompt": [5, 6, 7], "max_tokens": 2, "ignore_eos": True}
        got = httpx.post(fleet.urls[0] + "/v1/completions", json=body, timeout=120)
        assert got.status_code == 200, got.text
    assert left_running(before, timeout_s=60) == {}
