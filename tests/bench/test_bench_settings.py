"""Router settings as the benchmark sets them, and the same settings as the simulator sees
them: each lands in the right field, the benchmark's own are refused from `--router-set`, and
a bad KEY=VALUE says what was wrong."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest

from loom.bench.settings import (
    BENCH_SETS,
    RouterSettingError,
    RouterSetup,
    engine_spec,
    router_config,
    router_setting,
    serve_flags,
    simulated_engines,
    simulated_router,
)
from loom.core.errors import ConfigError
from loom.core.topology import GpuType
from loom.rollout.engine_queue import EngineSchedulingPolicy
from loom.rollout.policy import PlacementKind, SchedulerKind
from loom.runtime.emulate.config import EmulatedEngineConfig
from loom.runtime.rollout.policies import make_router

EMULATED = RouterSetup(
    max_running=1024, queue=2, tp=2, priority=True, model="qwen3-14b", gpu="h100",
    settings={"refit_every": 100000, "max_preemptions": 0},
)  # fmt: skip
PROFILED = RouterSetup(max_running=4, profiles=(Path("/p/tiny.csv"),))


# ---- --router-set KEY=VALUE ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("refit_every=100000", ("refit_every", 100000)),
        ("max_preemptions=0", ("max_preemptions", 0)),
        ("kv_full=0.9", ("kv_full", 0.9)),
        ("tokenizer=engine", ("tokenizer", "engine")),  # not JSON: text
        (" max_wait_s=5", ("max_wait_s", 5)),
    ],
)
def test_a_setting_is_read_as_json_where_it_parses(text: str, expected: tuple) -> None:
    assert router_setting(text) == expected


@pytest.mark.parametrize("key", sorted(BENCH_SETS))
def test_the_settings_the_benchmark_sets_itself_are_refused(key: str) -> None:
    with pytest.raises(RouterSettingError, match=f"the benchmark sets {key} itself"):
        router_setting(f"{key}=x")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("refit_every", r"'refit_every': expected KEY=VALUE, e\.g\. refit_every=100000"),
        ("=5", r"expected KEY=VALUE"),
        ("refit_evry=5", r"refit_evry is not a setting of the router; one of .*refit_every"),
        ("refit_every=abc", r"refit_every cannot be 'abc': Input should be a valid integer"),
        ("refit_every=0", r"refit_every cannot be 0: .*greater than or equal to 1"),
        ("kv_full=2", r"kv_full cannot be 2: .*less than or equal to 1"),
        ("stall_timeout_s=-1", r"stall_timeout_s cannot be -1: .*greater than 0"),
    ],
)
def test_a_bad_setting_says_what_was_wrong(text: str, message: str) -> None:
    with pytest.raises(RouterSettingError, match=message):
        router_setting(text)


def test_argparse_prints_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench")
    ap.add_argument("--router-set", type=router_setting, action="append", default=[])
    assert ap.parse_args(["--router-set", "refit_every=7"]).router_set == [("refit_every", 7)]
    with pytest.raises(SystemExit) as exit_:
        ap.parse_args(["--router-set", "scheduler=fcfs"])
    assert exit_.value.code == 2
    assert "argument --router-set: 'scheduler=fcfs': the benchmark sets scheduler itself" in (
        capsys.readouterr().err
    )


def test_a_setup_refuses_what_it_sets_itself() -> None:
    with pytest.raises(ConfigError, match="the benchmark sets placement itself"):
        RouterSetup(max_running=4, settings={"placement": "heddle"})
    with pytest.raises(ConfigError, match="model and gpu come together"):
        RouterSetup(max_running=4, model="qwen3-14b")
    with pytest.raises(ConfigError, match="max_running and tp must be >= 1"):
        RouterSetup(max_running=0)


# ---- the served router -----------------------------------------------------------------------


def test_engine_spec_carries_the_cap_the_queue_and_the_emulated_degree() -> None:
    assert engine_spec("http://e0", RouterSetup(max_running=4)) == "http://e0,max_running=4"
    assert engine_spec("http://e0", RouterSetup(max_running=4, queue=1)) == (
        "http://e0,max_running=4,queue=1"
    )
    assert (
        engine_spec("http://e0", EMULATED)
        == "http://e0,max_running=1024,queue=2,tp=2,node=0,priority"
    )
    # engines of a layout: each its own degree and node
    laid = replace(EMULATED, slots=((8, 0), (4, 1), (4, 1)))
    assert engine_spec("http://e2", laid, 2).endswith(",tp=4,node=1,priority")
    assert [(e.spec.tp, e.node) for e in simulated_engines(laid, 3)] == [(8, 0), (4, 1), (4, 1)]
    assert [(e.tp, e.node) for e in simulated_router(laid, "heddle", "pps", 3).engines] == [
        (8, 0),
        (4, 1),
        (4, 1),
    ]


def test_router_config_in_this_process() -> None:
    cfg = router_config(EMULATED, "heddle", "pps", ["http://e0", "http://e1"], state_dir=None)
    assert (cfg.placement, cfg.scheduler) == (PlacementKind.HEDDLE, SchedulerKind.PPS)
    assert cfg.port == 0 and cfg.state_dir is None
    assert [(e.url, e.max_running, e.queue, e.tp, e.priority) for e in cfg.engines] == [
        ("http://e0", 1024, 2, 2, True),
        ("http://e1", 1024, 2, 2, True),
    ]
    assert (cfg.model, cfg.gpu, cfg.profiles) == ("qwen3-14b", "h100", ())
    assert (cfg.refit_every, cfg.max_preemptions) == (100000, 0)
    profiled = router_config(PROFILED, "least_load", "rr", ["http://e0"], state_dir=Path("/s"))
    assert profiled.profiles == (Path("/p/tiny.csv"),) and profiled.state_dir == Path("/s")


def test_serve_flags_as_loom_serve_rollout_takes_them(tmp_path: Path) -> None:
    cfg = tmp_path / "router.json"
    flags = serve_flags(EMULATED, "cache_aware", "rr", ["http://e0"], state_dir=tmp_path,
                        config=cfg)  # fmt: skip
    assert flags == [
        "--placement", "cache_aware", "--scheduler", "rr", "--state-dir", str(tmp_path),
        "--engine", "http://e0,max_running=1024,queue=2,tp=2,node=0,priority", "--config", str(cfg),
    ]  # fmt: skip
    assert json.loads(cfg.read_text()) == {
        "refit_every": 100000,
        "max_preemptions": 0,
        "model": "qwen3-14b",
        "gpu": "h100",
    }
    bare = serve_flags(PROFILED, "heddle", "pps", ["http://e0"], state_dir=tmp_path, config=None)
    assert bare[-2:] == ["--profile", "/p/tiny.csv"] and "--config" not in bare


# ---- the simulator ---------------------------------------------------------------------------


def test_the_simulated_router_reads_the_same_policy_settings() -> None:
    cfg = simulated_router(EMULATED, "hybrid", "rr", 3)
    assert (cfg.placement, cfg.scheduler) == (PlacementKind.HYBRID, SchedulerKind.RR)
    assert [(e.url, e.max_running, e.tp) for e in cfg.engines] == [
        (f"http://sim{i}", 1024, 2) for i in range(3)
    ]
    assert (cfg.model, cfg.gpu, cfg.profiles) == ("qwen3-14b", "h100", ())
    assert (cfg.refit_every, cfg.max_preemptions) == (100000, 0)
    assert simulated_router(PROFILED, "heddle", "pps", 1).profiles == (Path("/p/tiny.csv"),)


def test_a_router_setting_reaches_the_simulated_policy() -> None:
    setup = RouterSetup(max_running=8, settings={"rose_cap_per_gpu": 3, "rose_lease_s": 1.5})
    policy = make_router(simulated_router(setup, "rose", "fcfs", 2))
    assert policy.router.cap_per_gpu == 3  # type: ignore[attr-defined]
    assert policy.lease_s == 1.5  # type: ignore[attr-defined]


def test_the_emulated_engines_as_the_simulator_models_them() -> None:
    engines = simulated_engines(EMULATED, 3, max_running=256)
    assert len(engines) == 3
    e = engines[0]
    assert (e.spec.model, e.spec.gpu, e.spec.tp) == ("qwen3-14b", GpuType.H100, 2)
    assert e.max_running == 256  # the engines' own cap, not the router's
    assert e.scheduling_policy is EngineSchedulingPolicy.PRIORITY  # the setup sends priorities
    assert e.decode_reserve == EmulatedEngineConfig(spec=e.spec).decode_reserve
    router = simulated_router(EMULATED, "heddle", "pps", 3)
    assert [(c.max_running, c.queue, c.tp) for c in router.engines] == [(1024, 2, 2)] * 3


def test_the_profiled_engines_as_the_simulator_models_them() -> None:
    (e,) = simulated_engines(PROFILED, 1, decode_reserve=256)
    assert e.max_running == 4  # the router's admission cap
    assert e.decode_reserve == 256
    assert e.scheduling_policy is EngineSchedulingPolicy.FCFS  # it refuses priorities


def test_an_ablation_system_sets_its_router_over_the_benchmarks(tmp_path: Path) -> None:
    from loom.bench.systems import system

    nokv, heddle = system("heddle-nokv"), system("heddle")
    assert nokv.policies == heddle.policies == ("heddle", "pps")
    assert heddle.setup(EMULATED) is EMULATED
    off = nokv.setup(EMULATED)
    assert off.settings == {**EMULATED.settings, "move_kv": False}
    assert simulated_router(off, "heddle", "pps", 2).move_kv is False
    assert simulated_router(EMULATED, "heddle", "pps", 2).move_kv is True
    cfg = tmp_path / "router.json"
    serve_flags(off, "heddle", "pps", ["http://e0"], state_dir=tmp_path, config=cfg)
    assert json.loads(cfg.read_text())["move_kv"] is False
