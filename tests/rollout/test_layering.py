"""`loom.rollout` holds policies only: importing it, or any of its modules, loads no driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import loom

PROBE = """
import importlib, json, pkgutil, sys
import loom.rollout
names = [m.name for m in pkgutil.walk_packages(loom.rollout.__path__, "loom.rollout.")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "loaded": sorted(sys.modules)}))
"""

DRIVERS = ("loom.sim", "loom.runtime", "loom.experiments", "loom.cli")


def test_rollout_policies_import_no_driver() -> None:
    src = str(Path(loom.__file__).resolve().parents[1])  # the loom this test run imports
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=env,
    )
    report = json.loads(out.stdout)
    assert "loom.rollout.heddle.planner" in report["imported"]
    assert "loom.rollout.heddle.predictor" in report["imported"]
    leaked = [m for m in report["loaded"] if any(m == d or m.startswith(d + ".") for d in DRIVERS)]
    assert not leaked, f"importing loom.rollout loaded {leaked}"
