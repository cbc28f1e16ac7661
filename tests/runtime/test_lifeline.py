"""`loom.proc.lifeline` for real: a child tied to its parent dies when the parent is
SIGKILLed, even one blocked in a sleep; a process the parent forked (without an exec) does not
keep the tie alive; a clean stop gets its turn first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import sys, time
from pathlib import Path
from loom.proc.lifeline import watch_parent
mark = Path(sys.argv[1])
assert watch_parent(lambda: mark.write_text("clean stop"), grace_s=0.5)
time.sleep(600)
"""

PARENT = """
import json, os, subprocess, sys, time
from loom.proc.lifeline import child_popen
env = dict(os.environ)
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], env=env,
                         **child_popen(env))
forked = os.fork()  # a fork without an exec: it must not hold the parent's end open
if forked == 0:
    time.sleep(600)
    os._exit(0)
print(json.dumps([child.pid, forked]), flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_a_child_dies_with_its_sigkilled_parent(tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, str(mark)], stdout=subprocess.PIPE
    )
    child = forked = 0
    try:
        assert parent.stdout is not None
        child, forked = json.loads(parent.stdout.readline())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(30)
        deadline = time.monotonic() + 30
        while not _gone(child):
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.05)
        assert mark.read_text() == "clean stop"  # its clean stop ran before it was killed
        assert not _gone(forked)  # (the forked copy lives on: it is not a tied child)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
        for pid in (child, forked):
            if pid and not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_an_untied_process_watches_nothing() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "from loom.proc.lifeline import watch_parent as w; print(w())"],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "LOOM_LIFELINE_FD"},
    )
    assert out.stdout.strip() == "False"
