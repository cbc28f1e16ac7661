"""A worker-process group under faults, for real: a rank that raises fails the operation at
once (the other rank is still waiting in its collective), and the group is found unusable
until it is killed; a payload no rank can run fails on every rank alike and the group goes
on; a wedged rank is caught by the operation's deadline; a rank that exits is named; and when
the process that started a group is SIGKILLed, its ranks (one wedged in a collective) and its
sidecar die with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from cluster_procs import descendants, gone, wait_gone

from loom.core.errors import ConfigError
from loom.runtime.cluster.wpg import (
    GroupBroken,
    RankFailed,
    WorkerGroup,
    WorkerGroupConfig,
)
from loom.runtime.cluster.wpg import group as wpg_group

pytestmark = [pytest.mark.torch, pytest.mark.slow]

BATCH = [[1, 5, 9, 3], [4, 4, 8, 1]]


def group(tmp_path: Path, name: str, settle_s: float = 10.0) -> WorkerGroup:
    return WorkerGroup(
        WorkerGroupConfig(
            name=name, dp=2, state_dir=tmp_path / name, faults=True, settle_s=settle_s
        )
    )


def test_a_rank_that_raises_fails_the_operation_without_waiting_for_the_others(
    tmp_path: Path,
) -> None:
    with group(tmp_path, "raiser", settle_s=1.0) as g:
        pids = set(g.pids)
        # rank 1 raises; rank 0 waits in its all-reduce for rank 1, forever: the operation
        # fails with rank 1's error all the same (had it waited for rank 0, it would hang)
        with pytest.raises(RankFailed, match="rank 1: RuntimeError: injected fault") as err:
            g.run("inject_fault", {"rank": 1, "action": "raise"})
        assert err.value.pending == {0}
        assert not g.settle(0.5)  # rank 0 is still in the collective
        with pytest.raises(GroupBroken, match=r"ranks \[0\] never finished"):
            g.run("sync_weights")
        g.kill()
        assert not wait_gone(pids, 30)


def test_a_payload_no_rank_can_run_fails_on_every_rank_and_the_group_goes_on(
    tmp_path: Path,
) -> None:
    with group(tmp_path, "checked") as g:
        with pytest.raises(ConfigError, match=r"token id 500 at row 1, position 2"):
            g.run("forward", {"ids": [[1, 2, 3], [4, 5, 500]]})  # refused before it is sent
        # sent anyway (past the group's own check): every rank checks the whole batch before
        # it computes, so no rank enters a collective the others skip
        with pytest.raises(RankFailed, match="outside the model's vocabulary"):
            g._run_ranks("forward_backward", {"ids": [[1, 2, 3], [4, 5, 500]]}, 60)
        assert g.settle(30)
        assert len(g.run("forward", {"ids": BATCH})["logprobs"]) == 2
        for bad, words in [
            ({"ids": [[1, 2, 3], [4, 5]]}, "ragged batch"),
            ({"ids": [[1, 2.5]]}, "valid integer"),
            ({"ids": [[1, 2]], "advantages": [1.0, 2.0]}, "2 advantages for 1 rows"),
            ({"ids": [[1, 2]], "temperature": 1.0}, "temperature: not a field"),
        ]:
            with pytest.raises(ConfigError, match=words):
                g.run("forward_backward", bad)
        g.run("forward_backward", {"ids": BATCH})


def test_a_wedged_rank_is_caught_by_the_deadline(tmp_path: Path) -> None:
    with group(tmp_path, "wedged") as g:
        with pytest.raises(GroupBroken, match=r"ran past its deadline of 2 s"):
            g.run("inject_fault", {"rank": 1, "action": "hang"}, timeout_s=2)
        g.kill()
        assert not g.alive


def test_a_rank_that_exits_mid_operation_is_named(tmp_path: Path) -> None:
    with (
        group(tmp_path, "exits") as g,
        pytest.raises(GroupBroken, match=r"rank 0 \(pid \d+\) exited \(13\)"),
    ):
        g.run("inject_fault", {"rank": 0, "action": "exit"})


def test_an_exit_is_named_even_when_the_survivors_error_is_read_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 exits inside the all-reduce; rank 1 then raises (gloo: "connection reset by
    peer"). Whichever the parent reads first, the cause it names is the exit: here rank 0's
    end is hidden from the parent until rank 1 has answered."""
    real_wait = wpg_group.wait_ready
    with group(tmp_path, "exits-late") as g:
        first = g._conns[0]

        def survivor_first(conns: list[Any], timeout: float) -> list[Any]:
            if first in conns and len(conns) > 1:  # rank 1 has not answered yet
                return [c for c in real_wait(conns[1:], timeout)]
            return real_wait(conns, timeout)

        monkeypatch.setattr(wpg_group, "wait_ready", survivor_first)
        with pytest.raises(GroupBroken, match=r"rank 0 \(pid \d+\) exited \(13\).*rank 1: "):
            g.run("inject_fault", {"rank": 0, "action": "exit"}, timeout_s=60)


PARENT = """
import json, sys
from pathlib import Path
from loom.runtime.cluster.wpg import WorkerGroup, WorkerGroupConfig
g = WorkerGroup(WorkerGroupConfig(name="orphan", dp=2, state_dir=Path(sys.argv[1]), faults=True))
g.start()
print(json.dumps({"ranks": g.pids, "sidecar": g._sidecar.pid}), flush=True)
g.run("inject_fault", {"rank": 1, "action": "hang"})  # rank 0 waits in its collective
"""


def test_a_groups_processes_die_with_the_process_that_started_it(tmp_path: Path) -> None:
    """SIGKILL leaves the starter no chance to clean up: the ranks (one asleep, one blocked
    in gloo's all-reduce) and the sidecar notice on their own."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "orphan")],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    children: set[int] = set()
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line, "the group did not start"
        pids = json.loads(line)
        children = set(pids["ranks"]) | {pids["sidecar"]}
        assert children <= descendants(parent.pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(30)
        assert not wait_gone(children, 60), "a child outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
        for p in children:
            if not gone(p):
                os.kill(p, signal.SIGKILL)
