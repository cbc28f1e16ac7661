"""A verl-style code tool and reward on Loom's action server, through SandboxFusion's API.

verl's sandbox-fusion tool and its code reward post `{"code", "language", "run_timeout",
"stdin", ...}` to `<sandbox_fusion_url>/run_code` and read `run_result`. Pointing that URL at
`loom serve actions` runs the same code contained (cgroups, bubblewrap) and scheduled with the
rest of the rollout's actions — nothing else changes. This file does what such a tool and
reward do: run a model-written solution against test cases, and score it.

    # against a running action server (loom serve actions --port 8700)
    python examples/sandbox_fusion_tool.py --url http://127.0.0.1:8700
    # self-contained: an action server in this process
    python examples/sandbox_fusion_tool.py --demo
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Iterator

import httpx

SOLUTION = """\
n = int(input())
print(sum(i * i for i in range(1, n + 1)))
"""
CASES = [("3", "14"), ("10", "385"), ("1", "1")]


class CodeTool:
    """The tool a policy calls mid-trajectory: run code, get its output back as text."""

    def __init__(self, sandbox_fusion_url: str, run_timeout: float = 10.0) -> None:
        self.http = httpx.Client(base_url=sandbox_fusion_url, timeout=run_timeout + 30)
        self.run_timeout = run_timeout

    def execute(self, code: str, stdin: str = "", language: str = "python") -> dict:
        body = {"code": code, "language": language, "run_timeout": self.run_timeout}
        resp = self.http.post("/run_code", json={**body, "stdin": stdin})
        resp.raise_for_status()
        return dict(resp.json())

    def as_text(self, result: dict) -> str:
        run = result.get("run_result") or {}
        if result["status"] == "SandboxError":
            return f"sandbox error: {result.get('message')}"
        output = f"{run.get('stdout', '')}{run.get('stderr', '')}".strip()
        return f"{output} [{run.get('status')}, exit code {run.get('return_code')}]"


def reward(tool: CodeTool, code: str, cases: list[tuple[str, str]]) -> float:
    """The share of test cases whose output matches (a code reward's usual form)."""
    passed = 0
    for stdin, expected in cases:
        result = tool.execute(code, stdin=stdin)
        run = result.get("run_result") or {}
        passed += result["status"] == "Success" and run["stdout"].strip() == expected
    return passed / len(cases)


@contextlib.contextmanager
def _demo_server() -> Iterator[str]:
    from loom.runtime.actions import ActionServerConfig, BackgroundServer
    from loom.runtime.actions.sandbox import probe_bubblewrap

    try:
        probe_bubblewrap()
        sandbox = "bwrap"
    except Exception:  # no bubblewrap here: run unisolated, as --sandbox none would
        sandbox = "none"
    with tempfile.TemporaryDirectory() as work:
        cfg = ActionServerConfig(port=0, workdir=work, sandbox=sandbox)
        with BackgroundServer(cfg) as server:
            yield server.url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="the action server (SandboxFusion's sandbox_fusion_url)")
    ap.add_argument("--demo", action="store_true", help="start an action server here")
    args = ap.parse_args()
    if not args.demo and not args.url:
        ap.error("give --url or --demo")
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(_demo_server()) if args.demo else args.url
        tool = CodeTool(url)
        print("tool call:", tool.as_text(tool.execute(SOLUTION, stdin="4")))
        print("tool call:", tool.as_text(tool.execute("print(1/0)")).splitlines()[-1])
        print(f"reward of the solution: {reward(tool, SOLUTION, CASES):.2f}")
        print(f"reward of a wrong one:  {reward(tool, 'print(0)', CASES):.2f}")


if __name__ == "__main__":
    main()
