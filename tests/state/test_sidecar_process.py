"""The sidecar process and what outlives it: `python -m loom.state.sidecar` still starts it; a
worker killed while its export waits in a collective call leaves a shared-memory file that the
sidecar removes when it lets the call go, and that the sidecar's owner removes after a SIGKILLed
sidecar; the live pids' files are left alone."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from loom.state.sidecar import SidecarConfig, StateSidecar  # noqa: E402
from loom.state.sidecar.shm import PREFIX, shm_dir, sweep_orphans  # noqa: E402

pytestmark = [pytest.mark.torch]

# a rank of two that offloads and waits for the other (which never comes)
WORKER = """
import sys, torch
from loom.state.manager import StateKey
from loom.state.sidecar import StateClient
c = StateClient(sys.argv[1], bytes.fromhex(sys.argv[2]))
c.offload("w", 0, 2, 0, {StateKey("w", "weights", "x"): torch.ones(1000)})
"""


def waiting_worker(sc: StateSidecar) -> tuple[subprocess.Popen[bytes], str]:
    """A worker waiting in a collective offload, and its export's shared-memory file. It
    imports torch first: on a loaded machine that alone can take a minute."""
    worker = subprocess.Popen([sys.executable, "-c", WORKER, sc.address, sc.token.hex()])
    deadline = time.monotonic() + 180
    try:
        while not (files := glob.glob(os.path.join(shm_dir(), f"{PREFIX}{worker.pid}-*"))):
            assert worker.poll() is None, f"the worker exited ({worker.returncode})"
            assert time.monotonic() < deadline, "the worker exported nothing"
            time.sleep(0.05)
        with sc.client(timeout_s=30) as c:  # its call has reached the sidecar
            while c.call("stats")["waiting"] != {"offload w": [0]}:
                assert worker.poll() is None and time.monotonic() < deadline, "no call arrived"
                time.sleep(0.05)
    except BaseException:
        worker.kill()
        worker.wait()
        raise
    return worker, files[0]


def kill(pid: int, proc: subprocess.Popen[bytes] | None = None) -> None:
    os.kill(pid, signal.SIGKILL)
    if proc is not None:
        proc.wait(30)


def test_a_killed_workers_export_goes_when_its_call_is_let_go(tmp_path: Path) -> None:
    with StateSidecar(SidecarConfig(gpus=2, disk_dir=str(tmp_path))) as sc:
        worker, export = waiting_worker(sc)
        kill(worker.pid, worker)
        assert os.path.exists(export)  # the dead worker could not remove it
        with sc.client(timeout_s=30) as c:
            assert c.call("abandon", dep="w") == 1
        assert not os.path.exists(export)


def test_a_sigkilled_sidecar_leaves_no_segment_once_its_owner_cleans_up(tmp_path: Path) -> None:
    sc = StateSidecar(SidecarConfig(gpus=2, disk_dir=str(tmp_path))).start()
    try:
        worker, export = waiting_worker(sc)
        assert sc.pid is not None
        kill(worker.pid, worker)
        kill(sc.pid)
        deadline = time.monotonic() + 30
        while sc.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sc.exit_code == -signal.SIGKILL
        assert os.path.exists(export)  # neither the worker nor the sidecar removed it
    finally:
        sc.close()
    assert not os.path.exists(export)


def test_only_the_files_of_dead_pids_are_swept(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mine = tmp_path / f"{PREFIX}{os.getpid()}-live"
    orphan = tmp_path / f"{PREFIX}{dead.pid}-dead"
    other = tmp_path / "loom-other-1-x"
    for f in (mine, orphan, other):
        f.write_bytes(b"x")
    assert sweep_orphans(str(tmp_path)) == [str(orphan)]
    assert mine.exists() and other.exists() and not orphan.exists()
