"""Rules of the whole test session.

In CI (`LOOM_CI=1`, which `.ci/run` sets) everything CI installs must be there: a session
without bubblewrap, the verl environment or an extra stops at once, and a test that skips for
want of something fails instead, unless it is marked `gpu` (needs a CUDA device, which CI has
not) or `may_skip_in_ci` (says why in its docstring). A broken install step cannot then pass
as a suite of skips.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

CI = os.environ.get("LOOM_CI") == "1"
ROOT = Path(__file__).resolve().parents[1]

# what CI installs, and how to tell it is there
_CI_NEEDS = {
    "bubblewrap (apt-get install bubblewrap)": lambda: shutil.which("bwrap") is not None,
    "the verl environment (.ci/verl-env)": lambda: Path(
        os.environ.get("LOOM_VERL_PYTHON", ROOT / ".venv-verl" / "bin" / "python")
    ).exists(),
    **{
        f"the {extra} extra ({module})": (lambda m=module: importlib.util.find_spec(m) is not None)
        for extra, module in (
            ("torch", "torch"),
            ("cpu-engine", "vllm"),
            ("ray", "ray"),
            ("docs", "mkdocs"),
            ("docs", "cogapp"),
            ("benchmarks' peer", "sglang_router"),
        )
    },
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (may skip in CI)")
    config.addinivalue_line(
        "markers", "may_skip_in_ci: may skip in CI too (a race it cannot force; says why)"
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    if not CI:
        return
    missing = [what for what, there in _CI_NEEDS.items() if not there()]
    if missing:
        pytest.exit(f"CI lacks {', '.join(missing)}: its install step failed", returncode=3)


def _allowed(item: Any) -> bool:
    return any(item.get_closest_marker(m) for m in ("gpu", "may_skip_in_ci"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if CI and report.skipped and not hasattr(report, "wasxfail") and not _allowed(item):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which must run it: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    outcome = yield
    report = outcome.get_result()
    if CI and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"{collector.nodeid} skipped in CI, which must run it: {reason}"
