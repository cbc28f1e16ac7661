"""A benchmark script's `--json PATH` (`loom.bench.script`), and every script in `benchmarks/`
whose figures the docs quote run at its smallest setting with `--json`: the document reads
back, names the command, and its records carry the fields the docs use, every value finite or
null.

Not run here: `bench_weight_sync.py`, `bench_vllm_kv_move.py` and `profile_engine.py`, which
start vLLM CPU engines (about a minute even at their smallest; their parts have tests of their
own: `tests/runtime/engine/test_weight_sync.py`, `test_kv_connector.py`,
`test_engine_profile.py`), and `bench_rollout_router.py --continuous` (about 40 s at its
smallest; `loom.bench.continuous` is tested in `test_bench_continuous.py`).
`bench_host_device_copy.py` needs CUDA (`gpu`). `bench_rollout_runtime.py` has a test of its
own. `bench_rollmux.py` (`--quick` still builds 2,000 jobs), `bench_cluster_service.py` (two
worker-process groups to start), `bench_rose_served.py` (nine emulated engines to start) and
`soak_router.py` take 10-30 s and are `slow`.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loom.bench.results import read_results
from loom.bench.script import add_json_option, write_json

ROOT = Path(__file__).resolve().parents[2]


def test_the_option_is_off_unless_given(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_json_option(parser)
    assert parser.parse_args([]).json is None
    assert write_json(None, "bench_x", [{"x_s": 1.0}], seed=0) is None
    path = parser.parse_args(["--json", str(tmp_path / "a" / "x.json")]).json
    assert write_json(path, "bench_x", [{"x_s": float("nan")}], seed=3) == path
    doc = read_results(path)
    assert (doc["benchmark"], doc["seed"], doc["records"]) == ("bench_x", 3, [{"x_s": None}])


@dataclass(frozen=True)
class Script:
    """A benchmark, its smallest setting, and per record kind the fields the docs use."""

    name: str
    args: tuple[str, ...]
    fields: dict[str, str]  # record kind: its fields, space-separated
    needs: tuple[str, ...] = ()  # a module or a program each, that it cannot run without
    marks: tuple[Any, ...] = ()
    mode: str = ""  # which of its modes, where it has several

    def param(self) -> Any:
        return pytest.param(self, id=self.name + self.mode, marks=self.marks)


SCRIPTS = [
    Script(
        "bench_weight_relay",
        ("--buckets", "2", "--bucket-mb", "4", "--batch-mb", "8", "--repeats", "1"),
        {"phase": "phase mb mb_s wall_s relay_cpu_s relay_cpu_s_per_gb"},
    ),
    Script(
        "bench_weight_codec",
        ("--mib", "1", "--repeats", "1"),
        {
            "setup": "mib repeats cpus numpy load_average",
            "codec": "backend case changed_share encode_gb_s apply_gb_s",
        },
    ),
    Script(
        "bench_action_server",
        ("--n", "2", "--seconds", "0.1", "--sandbox", "none"),
        {
            "overhead": (
                "actions cores sandbox exec_median_s overhead_median_ms overhead_p95_ms "
                "server_overhead_share_median client_overhead_share_median"
            ),
            "paper": "workload overhead_share",
        },
    ),
    Script(
        "bench_action_server",
        ("--start-latency", "--n", "3"),
        {
            "start": "sandbox median_ms p99_ms",
            "added": "median_ms p99_ms target_median_ms",
        },
        needs=("bwrap",),
        mode="-start-latency",
    ),
    Script(
        "bench_cluster_service",
        ("--n", "3"),
        {"op": "op direct_p50_ms served_p50_ms overhead_p50_ms"},
        needs=("torch",),
        marks=(pytest.mark.slow,),
    ),
    Script(
        "bench_state_manager",
        ("--mb", "64", "--dp", "1", "--repeats", "1", "--warmup", "0", "--tiers", "host"),
        {"move": "move direction tier device mb dp gb_s gb_s_runs"},
        needs=("torch",),
    ),
    Script(
        "bench_tangram_scheduler",
        ("--repeats", "1"),
        {"decision": "policy candidates queued_behind decision_ms with_allocation_ms"},
    ),
    Script(
        "bench_placement",
        ("--repeats", "1"),
        {"case": "case n median_ms makespan", "baseline": "degree makespan"},
    ),
    Script(
        "bench_arrange",
        ("--repeats", "1"),
        {"case": "case tasks capacity median_ms total units_used"},
    ),
    Script(
        "bench_engine",
        ("--runs", "1", "--events", "20000"),
        {"rate": "events_per_s events_per_s_min events_per_s_max"},
    ),
    Script(
        "bench_rollmux",
        ("--quick",),
        {"decision": "policy jobs groups decision_ms"},
        marks=(pytest.mark.slow,),
    ),
    Script(
        "bench_plexrl_policies",
        ("--repeats", "1", "--residents", "4"),
        {
            "range_min": "p50_us p99_us target_p50_us",
            "hrrs": "p50_ms p99_ms target_p50_ms",
            "placement": "residents p50_ms p99_ms target_p50_ms",
        },
    ),
    Script(
        "bench_rose_policies",
        ("--repeats", "10"),
        {"decision": "step median_us p99_us target_us met"},
    ),
    Script(
        "calibrate_tangram_coding",
        ("--reward", "28", "--llm", "2", "--steps", "1", "--batch", "32", "--nodes", "1"),
        {
            "targets": "table1_exec_s fig3c_action_share",
            "point": "reward_median_s llm_median_s exec_s action_share",
        },
    ),
    Script(
        "calibrate_rose_workloads",
        ("--steps", "1"),
        {
            "rollout": "setup model gpus prefill_share makespan_s p75_s",
            "rollout_mean": "prefill_share makespan_s p75_over_makespan rollout_share",
            "dapo": "model launch_multiple_mean launch_multiple_max",
            "spot": "model mean_fraction gpus_lost recovery_s",
        },
    ),
    Script(
        "bench_rollout_router",
        ("--requests", "20", "--rounds", "1", "--prompt", "ids"),
        {
            "overhead": (
                "router concurrency added_p50_ms added_p99_ms router_cpu_ms_per_request "
                "requests_per_s"
            )
        },
    ),
    Script(
        "soak_router",
        ("--minutes", "0.1", "--trajectories", "4", "--every-s", "2"),
        {
            "sample": "t_s rss_mb finished",
            "growth": "second_half_growth_mb growth_per_trajectory_kb whole_run_growth_mb",
        },
        marks=(pytest.mark.slow,),
    ),
    Script(
        "bench_rose_served",
        ("--lent", "4", "--dedicated", "1", "--groups", "1", "--time-scale", "0.02"),
        {
            "served": (
                "lent_gpus trajectories rollout_s sim_rollout_s served_over_simulated moved "
                "serving_ended ttft_attainment tpot_attainment sim_ttft_attainment "
                "sim_tpot_attainment"
            )
        },
        marks=(pytest.mark.slow,),
    ),
    Script(
        "bench_host_device_copy",
        ("--sizes-mb", "16", "--repeats", "1"),
        {"copy": "size_mib host direction gb_s"},
        marks=(pytest.mark.gpu,),
        needs=("cuda",),
    ),
]


def _have(need: str) -> bool:
    if need == "cuda":
        if importlib.util.find_spec("torch") is None:
            return False
        import torch

        return bool(torch.cuda.is_available())
    return importlib.util.find_spec(need) is not None or shutil.which(need) is not None


def _finite(value: Any) -> bool:
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


@pytest.mark.parametrize("script", [s.param() for s in SCRIPTS])
def test_a_benchmark_writes_its_figures_as_json(script: Script, tmp_path: Path) -> None:
    for need in script.needs:
        if not _have(need):
            pytest.skip(f"needs {'CUDA' if need == 'cuda' else need}")
    out = tmp_path / "x.json"
    path = f"benchmarks/{script.name}.py"
    args = [str(tmp_path / a) if a.endswith(".csv") else a for a in script.args]
    proc = subprocess.run(
        [sys.executable, path, *args, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert f"to {out}" in proc.stdout, "it says where it wrote"
    doc = read_results(out)
    assert doc["benchmark"] == script.name
    assert doc["command"].startswith(f"python {path} ")
    assert "--json" in doc["command"]
    records = doc["records"]
    assert records, "at least one record"
    for record in records:
        bad = {k: v for k, v in record.items() if not _finite(v)}
        assert not bad, f"{record.get('record')}: not finite: {bad}"
    for kind, names in script.fields.items():
        wanted = set(names.split())
        of_kind = [r for r in records if r.get("record") == kind]
        assert of_kind, f"no {kind!r} record in {sorted({r.get('record') for r in records})}"
        for record in of_kind:
            assert wanted <= set(record), f"{kind}: missing {sorted(wanted - set(record))}"
