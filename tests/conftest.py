"""Rules of the whole test session.

The suite runs on two processes (`-n 2`, pytest-xdist). Tests that start real engines or
workers — vLLM engines (the `engine` mark: each takes a core), Ray (one local cluster at a
time), the cluster service's worker groups (torch processes with deadlines) — run one after
another on one of them (the `heavy` xdist group), so that no two of them compete for the two
cores; the action server's tests (cgroups, the sandbox) likewise in a group of their own.
Everything else spreads over both.

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


# (xdist group, how a test is known to belong to it), the first that matches
_GROUPS: tuple[tuple[str, Any], ...] = (
    ("heavy", lambda item: item.get_closest_marker("engine") is not None),
    ("heavy", lambda item: item.get_closest_marker("ray") is not None),
    ("heavy", lambda item: _under(item, "tests/runtime/cluster", "tests/state/test_sidecar.py")),
    (
        "actions",
        lambda item: _under(
            item,
            "tests/runtime/test_action_server",
            "tests/runtime/test_reaper.py",
            "tests/runtime/test_cgroups_discovery.py",
            "tests/runtime/test_example_sandbox_fusion.py",
        ),
    ),
)


def _under(item: Any, *prefixes: str) -> bool:
    path = Path(str(item.path)).resolve().relative_to(ROOT).as_posix()
    return path.startswith(prefixes)


@pytest.hookimpl(tryfirst=True)  # NOTE: before xdist reads the groups off the items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = next((name for name, belongs in _GROUPS if belongs(item)), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under `--dist loadgroup` xdist suffixes a grouped test's node id with its group; where
    it did not, the groups are silently ignored and heavy tests would share the cores."""
    if not getattr(session.config.option, "loadgroup", False):  # (set in xdist workers)
        return
    lost = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid
    ]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist did not group {len(lost)} tests (e.g. {lost[0]}): this pytest and "
            "pytest-xdist do not work together (pyproject.toml pins the range that does)"
        )


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
