"""`loom.integrations.verl.LoomLoadBalancer` inside verl 0.9.1 itself: built by verl's own
`get_router_handle` both ways (a router_config_path YAML, load_balancer_cls) and driven by
verl's `LLMServerClient` under a local Ray, in verl's environment (`.ci/verl-env` builds it:
verl pins a transformers the main environment cannot share)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert sum(report["served"]) == 18 and min(report["served"]) > 0  # 6 x 3 turns, both used
    assert report["inflight_after"] == 0  # fire-and-forget releases drained to zero
    assert report["status"]["trajectories"] == 6 and report["status"]["placement"] == "HeddleRouter"
    assert report["cleared"]["cleared_entries"] == 6
    assert set(report["cleared"]["server_loads"]) == {"10.0.0.0:8000", "10.0.0.1:8000"}
    assert report["after_clear"] == 0
    assert report["empty_pool"] == "No available servers in load balancer"
    assert report["readded"] == ["10.0.0.0:8000", "10.0.0.1:8000"]
    assert report["inflight_after_cls"] == 0 and report["status_cls"]["trajectories"] == 3


def test_an_older_verl_is_named(tmp_path: Path) -> None:
    """A verl without RequestLoadBalancer (before 0.9.1): importing the integration fails
    with the verl it needs, not silently."""
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
    assert "needs verl >= 0.9.1" in proc.stderr and "found verl 0.5.0" in proc.stderr
