"""How the server finds cgroup v2 and says why it cannot use it. This machine mounts v1 (its
unified hierarchy offers no controller), so v2 is exercised here on a directory laid out as
cgroupfs; the containment tests run v2 for real wherever the probe picks it."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom.runtime.actions import cgroups


@pytest.fixture
def unified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A v2 mount at tmp_path with the server in /svc."""
    base = tmp_path / "svc"
    base.mkdir()
    monkeypatch.setattr(cgroups, "_mounts", lambda: [(str(tmp_path), "cgroup2", {"rw"})])
    monkeypatch.setattr(cgroups, "_own_paths", lambda: {"": "/svc"})
    return base


def test_v2_without_the_controllers_says_which_are_missing(unified: Path) -> None:
    (unified / "cgroup.controllers").write_text("cpuset io\n")
    base, why = cgroups._v2_base()
    assert base is None and "does not offer memory, pids" in why


def test_v2_delegates_the_controllers_to_the_instance_groups(unified: Path) -> None:
    (unified / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (unified / "cgroup.subtree_control").write_text("memory\n")
    base, why = cgroups._v2_base()
    assert base == unified and why == ""
    assert (unified / "cgroup.subtree_control").read_text() == "+cpuset +pids"


def test_v2_that_cannot_delegate_names_the_fix(
    unified: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (unified / "cgroup.controllers").write_text("cpuset memory pids\n")
    (unified / "cgroup.subtree_control").write_text("")

    def busy(path: Path, value: str) -> None:  # the kernel's answer while processes sit there
        raise cgroups.CgroupError(f"cannot write {value!r} to {path}: Device or resource busy")

    monkeypatch.setattr(cgroups, "_write", busy)
    base, why = cgroups._v2_base()
    assert base is None
    assert "cannot delegate cpuset, memory, pids" in why and "Delegate=yes" in why
