"""`examples/agent_loop.py --demo` runs as the README says: turns through the router, tool
calls through the action server, every trajectory ended."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "agent_loop.py"


def test_the_agent_loop_example_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "--demo", "--prompts", "2", "--samples", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    lines = out.strip().splitlines()
    assert sum("3 turns, 72 tokens" in line for line in lines) == 4
    assert lines[-1].startswith("4 trajectories in") and "12 decisions" in lines[-1]
