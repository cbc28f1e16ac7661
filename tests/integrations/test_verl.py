"""`loom.integrations.verl.LoomLoadBalancer` inside verl 0.9.1 itself: built by verl's own
`get_router_handle` both ways (a router_config_path YAML, load_balancer_cls) and driven by
verl's `LLMServerClient` under a local Ray, in verl's environment (`.ci/verl-env` builds it:
verl pins a transformers the main environment cannot share). And under the contracts no
installed verl has, each replayed by a stand-in verl in `verl_replay/`: verl's main branch
(`load_balancer_cls`, releases by server only) and its KV-aware balancer work (a registry,
`__init__(servers, config)`, releases by prompt length)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from loom.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
VERL_PYTHON = Path(os.environ.get("LOOM_VERL_PYTHON", ROOT / ".venv-verl" / "bin" / "python"))


@pytest.mark.ray
@pytest.mark.skipif(
    not VERL_PYTHON.exists(), reason=f"no verl environment at {VERL_PYTHON}: run .ci/verl-env"
)
def test_verl_builds_and_drives_the_balancer_both_ways(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [str(VERL_PYTHON), str(Path(__file__).with_name("verl_driver.py")), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")), None)
    assert line is not None, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    report = json.loads(line[7:])
    assert report["mismatches"] == []  # every method of verl's RequestLoadBalancer, its names
    assert report["registry"] is False  # 0.9.1 has no registry: nothing to register with
    assert sum(report["served"]) == 18 and min(report["served"]) > 0  # 6 x 3 turns, both used
    assert report["inflight_after"] == 0  # fire-and-forget releases drained to zero
    assert report["status"]["trajectories"] == 6 and report["status"]["placement"] == "HeddleRouter"
    assert report["cleared"]["cleared_entries"] == 6
    assert set(report["cleared"]["server_loads"]) == {"10.0.0.0:8000", "10.0.0.1:8000"}
    assert report["after_clear"] == 0
    assert report["empty_pool"] == "No available servers in load balancer"
    assert report["readded"] == ["10.0.0.0:8000", "10.0.0.1:8000"]
    assert report["inflight_after_cls"] == 0 and report["status_cls"]["trajectories"] == 3


@pytest.mark.ray
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs the ray extra")
@pytest.mark.parametrize("mode", ["registry", "main"])
def test_other_verls_build_and_drive_the_balancer(tmp_path: Path, mode: str) -> None:
    """Contracts no installed verl has, each replayed by a stand-in verl
    (`verl_replay/MODE`). `registry`, verl's KV-aware balancer work: `router_strategy=loom`
    picks the class this module registered, built with `servers=` and `config=` (Loom's
    settings, or verl's default node with its cache size); releases carry the prompt length,
    not the request id. `main`, verl's main branch: the class passed as `load_balancer_cls`,
    acquires without a prompt, releases by server alone. Either way the releases drain to
    zero and end each trajectory's turn."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = str(Path(__file__).with_name("verl_replay") / mode)
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("verl_replay_driver.py")), mode],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")), None)
    assert line is not None, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    report = json.loads(line[7:])
    assert sum(report["served"]) == 18 and min(report["served"]) > 0
    assert report["inflight_after"] == 0
    assert report["status"]["trajectories"] == 6 and report["status"]["placement"] == "HeddleRouter"
    assert report["cleared"]["cleared_entries"] == 6  # every release found its trajectory
    assert report["empty_pool"] == "No available servers in load balancer"
    assert report["readded"] == ["10.0.0.0:8000", "10.0.0.1:8000"]
    if mode == "main":
        assert report["registered"] is False  # no registry: the class is passed in code
        return
    assert report["registered"] and report["strategies"] == ["loom"]
    assert report["mismatches"] == []  # every method of its protocol, its parameter names
    assert report["inflight_after_default_node"] == 0
    assert report["status_default_node"]["trajectories"] == 3
    assert "full_determinism is not supported" in report["full_determinism"]


def _balancer() -> Any:
    """`LoomLoadBalancer`, imported here: in verl's environment the import loads verl, whose
    0.9.1 imports Ray's deprecated `ray.experimental.state` (a warning, an error here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from loom.integrations.verl import LoomLoadBalancer
    return LoomLoadBalancer


def test_a_release_without_request_id_ends_the_turn_it_names() -> None:
    """The registry contract's release: `(server_id, prompt_len)`. Of two turns on one
    server, the one acquired with that prompt length is released, whichever came first."""
    LoomLoadBalancer = _balancer()
    lb = LoomLoadBalancer(
        servers={"a": 1}, config={"placement": "least_load", "max_cache_size": 10000}
    )
    lb.acquire_server(request_id="x", prompt_ids=[1, 2, 3])
    lb.acquire_server(request_id="y", prompt_ids=[1])
    lb.release_server(server_id="a", prompt_len=1)
    assert lb.get_total_inflight() == 1
    assert lb.clear_sticky_cache()["cleared_entries"] == 1  # y is between turns, x is not
    lb.release_server(server_id="a", prompt_len=99)  # no such length: the oldest, x
    lb.release_server(server_id="a", prompt_len=3)  # nothing left: ignored
    assert lb.get_total_inflight() == 0 and lb.clear_sticky_cache()["cleared_entries"] == 1
    with pytest.raises(ConfigError, match="full_determinism"):
        LoomLoadBalancer(servers={}, config={"full_determinism": True})


def test_an_older_verl_is_named(tmp_path: Path) -> None:
    """A verl with neither RequestLoadBalancer nor load_balancer_cls (before 0.9.0):
    importing the integration fails with the verl it needs, not silently."""
    pkg = tmp_path / "verl"
    (pkg / "workers" / "rollout").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.5.0'\n")
    (pkg / "workers" / "__init__.py").write_text("")
    (pkg / "workers" / "rollout" / "__init__.py").write_text("")
    (pkg / "workers" / "rollout" / "router.py").write_text("class Other: ...\n")
    proc = subprocess.run(
        [sys.executable, "-c", "import loom.integrations.verl"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        timeout=120,
    )
    assert proc.returncode != 0
    assert "needs verl >= 0.9.0" in proc.stderr and "found verl 0.5.0" in proc.stderr
