"""A tethered command and everything it starts end when the parent dies, SIGKILL included, and
also when the parent's killer kills the parent's direct children first (as Ray does); the
parent sees the command's own pid and exit status; the tether ends what the command left and
escalates to SIGKILL when the group ignores SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time

import pytest
from process_tree import (
    descendants,
    python_parent,
    sigkill_parent,
    wait_descendants,
    wait_gone,
)

from loom.proc.tether import Tethered, group_members


def _code(command: list[str], pipes: bool = False) -> str:
    """A Python program that tethers `command`, prints the command's pid and sleeps;
    `pipes`: the command's stdout and stderr are pipes to that process."""
    kwargs = "stdout=subprocess.PIPE, stderr=subprocess.PIPE" if pipes else ""
    return textwrap.dedent(
        f"""
        import subprocess, time
        from loom.proc.tether import Tethered
        child = Tethered({command!r}, {kwargs})
        print(child.pid, flush=True)
        time.sleep(600)
        """
    )


@pytest.mark.parametrize("children_first", [False, True])
def test_sigkill_of_the_parent_ends_the_whole_group(children_first: bool) -> None:
    # a shell with a child in the foreground and one in the background, in the group
    with python_parent(_code(["bash", "-c", "sleep 3001 & sleep 3002 & wait"])) as (parent, tree):
        assert parent.stdout is not None
        command = int(parent.stdout.readline())
        tree += wait_descendants(parent.pid, 4)  # bash, the tether, two sleeps
        assert tree[0].pid == command and tree[0].command.startswith("bash -c sleep 3001")
        assert sorted(group_members(command)) == sorted(p.pid for p in tree)
        if children_first:  # as Ray ends an actor's worker: its children, then the worker
            os.kill(command, signal.SIGKILL)
        assert sigkill_parent(parent, tree) == {}


def test_a_parent_whose_pipes_die_with_it_still_ends_the_group() -> None:
    # the command's stderr (the tether's too) is a pipe to the parent: once the parent is
    # gone the tether's note about it cannot be written, and the group must end all the same
    with python_parent(_code(["bash", "-c", "sleep 3007 & wait"], pipes=True)) as (parent, tree):
        assert parent.stdout is not None
        int(parent.stdout.readline())
        tree += wait_descendants(parent.pid, 3)  # bash, the tether, the sleep
        assert sigkill_parent(parent, tree) == {}


def test_the_exit_status_is_the_commands() -> None:
    assert Tethered(["sh", "-c", "exit 3"]).wait(30) == 3
    assert Tethered(["sh", "-c", "kill -9 $$"]).wait(30) == -signal.SIGKILL


def test_what_the_command_left_ends_with_it() -> None:
    proc = Tethered(["bash", "-c", "sleep 3003 & echo started"], stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=30)
    assert out == b"started\n" and proc.returncode == 0
    deadline = time.monotonic() + 30
    while (left := group_members(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []


def test_release_ends_the_group_and_a_signal_is_the_commands() -> None:
    released = Tethered(["sleep", "3004"])
    tree = wait_descendants(released.pid, 1)
    released.release()
    assert released.wait(30) == -signal.SIGTERM
    assert wait_gone(tree) == {}
    # a signal to the command alone (not its group) is the command's
    signalled = Tethered(["sleep", "3005"])
    wait_descendants(signalled.pid, 1)
    os.kill(signalled.pid, signal.SIGTERM)
    assert signalled.wait(30) == -signal.SIGTERM


def test_a_group_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    proc = Tethered(["bash", "-c", "trap '' TERM; sleep 3006; true"], grace_s=0.2)
    tree = wait_descendants(proc.pid, 2)
    proc.release()
    assert proc.wait(30) == -signal.SIGKILL
    assert wait_gone(tree) == {}


def test_a_command_that_cannot_start_says_why() -> None:
    proc = Tethered(["/nonexistent/loom-tool"], stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 127
    assert b"cannot run '/nonexistent/loom-tool': No such file or directory" in err


def test_the_tether_owns_stdin() -> None:
    before = set(descendants(os.getpid()))  # what earlier tests' fixtures run (engines, Ray)
    with pytest.raises(TypeError, match="stdin"):
        Tethered(["true"], stdin=subprocess.DEVNULL)
    assert set(descendants(os.getpid())) - before == set()  # nothing was started
