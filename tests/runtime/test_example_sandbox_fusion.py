"""`examples/sandbox_fusion_tool.py --demo` runs as the README says: a verl-style code tool
and reward through the action server's SandboxFusion route."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sandbox_fusion_tool.py"


def test_the_sandbox_fusion_example_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "--demo"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    assert out[0] == "tool call: 30 [Finished, exit code 0]"
    assert out[1] == "tool call: ZeroDivisionError: division by zero [Finished, exit code 1]"
    assert out[2:] == ["reward of the solution: 1.00", "reward of a wrong one:  0.00"]
