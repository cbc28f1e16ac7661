"""The reaper ends what its server listed once the server's pipe closes: the process groups
still listed (not the ones the server forgot), the directories it was given; a reaper that
died does not stop the server. (Killed servers: tests/runtime/test_action_server_containment.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from loom.runtime.reaper import Reaper


def _session(seconds: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", seconds], start_new_session=True)


def test_the_listed_groups_and_directories_go_when_the_pipe_closes(tmp_path: Path) -> None:
    scratch = tmp_path / "workspaces"
    (scratch / "t0").mkdir(parents=True)
    reaper = Reaper.start(remove=[scratch])
    listed, forgotten = _session("3101"), _session("3102")
    try:
        reaper.track(listed.pid)
        reaper.track(forgotten.pid)
        reaper.forget(forgotten.pid)
        reaper.close()  # as the kernel does when the server dies
        assert reaper.proc.returncode == 0
        assert listed.wait(10) == -9
        assert forgotten.poll() is None
        assert not scratch.exists()
    finally:
        for proc in (listed, forgotten):
            proc.kill()
            proc.wait()


def test_a_dead_reaper_is_reported_once_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    reaper = Reaper.start()
    reaper.proc.kill()
    reaper.proc.wait()
    for pgid in (1001, 1002):
        reaper.track(pgid)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and f"the reaper (pid {reaper.proc.pid}) is gone" in messages[0]
    reaper.close()
