"""Containing model-written code: every process an action starts (detached with `setsid` or not)
dies with it, whatever ends it — its own exit, a timeout, a cancel, its trajectory's end, the
server's SIGTERM, the server's SIGKILL (its reaper), or a server and reaper both killed with
SIGKILL and the server started again; under bubblewrap an action
sees neither other workspaces nor the server, and writes nowhere but its own workspace."""

from __future__ import annotations

import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from action_server_client import Client, procs_with, wait_no_procs
from process_tree import descendants, wait_descendants, wait_gone

from loom.runtime.actions.cgroups import _v1_bases as cgroups_v1_bases
from loom.runtime.actions.cgroups import cgroups_missing
from loom.runtime.actions.sandbox import bubblewrap_missing

PY = sys.executable
SANDBOX = "none" if bubblewrap_missing() else "bwrap"
CORES = sorted(os.sched_getaffinity(0))
NO_CGROUPS = cgroups_missing()
needs_cgroups = pytest.mark.skipif(NO_CGROUPS is not None, reason=f"no cgroups: {NO_CGROUPS}")
NO_BWRAP = bubblewrap_missing()
needs_bwrap = pytest.mark.skipif(NO_BWRAP is not None, reason=f"no sandbox: {NO_BWRAP}")
pytestmark = needs_cgroups


def _detach(marker: str) -> list[str]:
    """A command that leaves a `setsid` grandchild behind (its own session, no pipes) and
    exits; `marker` names the grandchild's command line."""
    return ["bash", "-c", f"setsid sleep {marker} </dev/null >/dev/null 2>&1 & echo ok"]


def _hold(marker: str) -> list[str]:
    """A command that leaves a detached grandchild behind and keeps running."""
    return ["bash", "-c", f"setsid sleep {marker} </dev/null >/dev/null 2>&1 & sleep 30"]


def _wait_running(marker: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not procs_with(marker):
        assert time.monotonic() < deadline, f"no process {marker} started"
        time.sleep(0.01)


@pytest.mark.parametrize("end", ["exit", "timeout", "cancel", "trajectory"])
def test_a_detached_child_dies_with_its_action(client: Client, end: str) -> None:
    marker = {"exit": "301.1", "timeout": "301.2", "cancel": "301.3", "trajectory": "301.4"}[end]
    if end == "exit":
        v = client.run(trajectory_id="d", command=_detach(marker))
        assert (v["status"], v["stdout"]) == ("succeeded", "ok\n")
    elif end == "timeout":
        v = client.run(trajectory_id="d", command=_hold(marker), timeout_s=1.0)
        assert v["status"] == "timed_out"
    else:
        aid = client.submit(trajectory_id="d", command=_hold(marker))
        _wait_running(marker)
        if end == "cancel":
            assert client.http.delete(f"/v1/actions/{aid}").json()["status"] == "cancelled"
        else:
            assert client.http.post("/v1/trajectories/d/end").json()["cancelled"] == [aid]
    assert not wait_no_procs(marker), f"the detached child outlived the action ({end})"
    assert client.http.get("/v1/stats").json()["busy_cores"] == []


def test_the_trajectory_memory_limit_spans_its_processes(client: Client) -> None:
    # four children of 400 MB each under 0.5 GB: not all of them can hold their memory
    script = textwrap.dedent(
        """
        import os, time
        kids = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                b = bytearray(400 * 2**20)
                time.sleep(1)
                os._exit(0)
            kids.append(pid)
        print(sum(os.waitpid(k, 0)[1] == 0 for k in kids))
        """
    )
    v = client.run(trajectory_id="m", command=[PY, "-c", script], memory_gb=0.5, timeout_s=30)
    assert v["status"] == "succeeded", v
    assert int(v["stdout"]) <= 1, f"{v['stdout']} children held 400 MB under 0.5 GB"


def test_a_trajectory_memory_limit_can_rise_and_fall(client: Client) -> None:
    # v1 keeps memory+swap >= memory: a raise and a cut must write the two in opposite orders
    for gb in (0.5, 1.0, 0.25):
        v = client.run(trajectory_id="grow", command=["true"], memory_gb=gb)
        assert v["status"] == "succeeded", (gb, v["error"])


def test_an_action_cannot_leave_its_cores(client: Client) -> None:
    every = ",".join(map(str, CORES))
    script = f"taskset -pc {every} $$ >/dev/null 2>&1; grep Cpus_allowed_list /proc/self/status"
    v = client.run(command=["bash", "-c", script], cpu=1)
    allowed = v["stdout"].split()[-1]
    assert allowed == str(v["cores"][0]), f"granted {v['cores']}, ran on {allowed}"


def test_stats_say_how_actions_are_contained(client: Client) -> None:
    stats = client.http.get("/v1/stats").json()
    assert stats["cgroups"] in (1, 2)
    assert stats["sandbox"] == SANDBOX


# -- isolation ------------------------------------------------------------------------------


@needs_bwrap
def test_an_action_sees_only_its_own_workspace(make_client: Callable[..., Client]) -> None:
    client = make_client(sandbox="bwrap")
    assert client.run(trajectory_id="a", command=["sh", "-c", "echo s > secret"])["status"] == (
        "succeeded"
    )
    root = client.workdir.parent
    outside = root / "escaped"
    script = (
        f"cat ../a/secret; ls {client.workdir}; echo x > {outside}; echo x > /etc/loom-escape;"
        " echo mine > mine; cat mine; echo tmp > /tmp/t && cat /tmp/t"
    )
    v = client.run(trajectory_id="b", command=["sh", "-c", script])
    assert "s\n" not in v["stdout"].splitlines(keepends=True)[:1]
    assert "No such file" in v["stderr"]  # ../a is not there
    assert v["stdout"].split() == ["b", "mine", "tmp"]  # only its own workspace is visible
    assert not outside.exists() and not Path("/etc/loom-escape").exists()
    assert (client.workdir / "b" / "mine").read_text() == "mine\n"  # its workspace is written


@needs_bwrap
def test_an_action_sees_neither_the_server_nor_its_environment(
    make_client: Callable[..., Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOM_TEST_SERVER_SECRET", "hunter2")
    client = make_client(sandbox="bwrap")
    server = os.getpid()
    script = f"env; kill -0 {server} && echo can-signal; ls /proc | grep -c '^[0-9]'"
    v = client.run(command=["sh", "-c", script], env={"MINE": "1"})
    assert "hunter2" not in v["stdout"] and "MINE=1" in v["stdout"]
    assert "can-signal" not in v["stdout"]
    assert int(v["stdout"].split()[-1]) <= 4  # its own PID namespace: a handful of processes


@needs_bwrap
def test_the_network_is_off_unless_asked(make_client: Callable[..., Client]) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), 2); print('up')"
        client = make_client(sandbox="bwrap")
        off = client.run(command=[PY, "-c", probe])
        assert off["status"] == "failed" and "up" not in off["stdout"]
        on = client.run(command=[PY, "-c", probe], network=True)
        assert on["status"] == "succeeded" and on["stdout"] == "up\n"
    refusing = make_client(sandbox="bwrap", network=False)
    r = refusing.http.post(
        "/v1/actions", json={"trajectory_id": "t", "command": ["true"], "network": True}
    )
    assert r.status_code == 400 and "--no-network" in r.text


# -- the server's own end ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[Callable[[], tuple[subprocess.Popen[bytes], str]]]:
    """Start `loom serve actions` as a process of its own; each call starts another."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(
        sandbox: str = SANDBOX, cgroups: bool = True, workdir: bool = True
    ) -> tuple[subprocess.Popen[bytes], str]:
        """`workdir` False: the server's own temporary directory, under tmp_path/tmp."""
        port = _free_port()
        config = tmp_path / f"server-{port}.toml"
        config.write_text(f"cgroups = {str(cgroups).lower()}\n")
        cmd = [PY, "-c", "from loom.cli import app; app()", "serve", "actions", "--port", str(port)]
        cmd += ["--sandbox", sandbox, "--config", str(config)]
        if workdir:
            cmd += ["--workdir", str(tmp_path / "work")]
        (tmp_path / "tmp").mkdir(exist_ok=True)
        env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", trust_env=False).status_code == 200:
                    return proc, url
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _submit(url: str, **body: Any) -> str:
    r = httpx.post(f"{url}/v1/actions", json=body, trust_env=False)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def test_sigterm_kills_what_the_actions_started(server_process: Callable[..., Any]) -> None:
    proc, url = server_process()
    _submit(url, trajectory_id="t", command=_hold("301.5"))
    _wait_running("301.5")
    proc.send_signal(signal.SIGTERM)
    # uvicorn shuts down gracefully, then re-raises the signal it caught
    assert proc.wait(30) in (0, -signal.SIGTERM)
    assert not wait_no_procs("301.5"), "a detached child outlived the server's SIGTERM"


def _instance_groups(server_pid: int) -> list[Path]:
    """The cgroups of the server instances of process `server_pid`, in every hierarchy."""
    bases, _ = cgroups_v1_bases()
    assert bases is not None, "this machine's cgroups are v1"
    return [g for base in bases.values() for g in base.glob(f"loom-{server_pid}-*")]


@pytest.mark.parametrize(
    ("sandbox", "cgroups"),
    [("none", True), ("none", False), pytest.param("bwrap", True, marks=needs_bwrap)],
)
def test_sigkill_of_the_server_ends_its_running_actions(
    server_process: Callable[..., Any], sandbox: str, cgroups: bool, tmp_path: Path
) -> None:
    marker = f"301.7{sandbox == 'bwrap':d}{cgroups:d}"
    proc, url = server_process(sandbox, cgroups, workdir=False)
    if cgroups:  # a grandchild in a session of its own: only the cgroups hold it
        _submit(url, trajectory_id="t", command=_hold(marker))
    else:  # without cgroups an action is its session (a `setsid` escapes it, and the reaper)
        _submit(url, trajectory_id="t", command=["bash", "-c", f"sleep {marker} & sleep 60"])
    _wait_running(marker)
    tree = wait_descendants(proc.pid, 4)  # the reaper and the action's processes
    assert any("loom.runtime.reaper" in p.command for p in tree)
    assert bool(_instance_groups(proc.pid)) == cgroups
    assert [p.name[:13] for p in tmp_path.joinpath("tmp").iterdir()] == ["loom-actions-"]
    proc.kill()  # SIGKILL: nothing of the server runs its cleanup
    proc.wait()
    assert wait_gone(tree) == {}, "processes of the server outlived it"
    assert not procs_with(marker)
    assert _instance_groups(proc.pid) == [], "the dead server's cgroups are left"
    assert list(tmp_path.joinpath("tmp").iterdir()) == [], "its temporary workspaces are left"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/healthz", trust_env=False)


def test_a_restarted_server_kills_what_a_killed_one_left(
    server_process: Callable[..., Any],
) -> None:
    # unsandboxed (bubblewrap's --die-with-parent would end the action with the server), and
    # the reaper killed with the server (it would end the action too): the cgroups are left
    proc, url = server_process("none")
    _submit(url, trajectory_id="t", command=_hold("301.6"))
    _wait_running("301.6")
    reaper = [p for p in descendants(proc.pid) if "loom.runtime.reaper" in p.command]
    assert len(reaper) == 1
    os.kill(reaper[0].pid, signal.SIGKILL)
    proc.kill()  # SIGKILL: nothing of the server runs its cleanup
    proc.wait()
    time.sleep(0.3)
    assert procs_with("301.6"), "the action should have outlived its server and reaper"
    server_process()  # the next server on this machine removes the dead one's groups
    assert not wait_no_procs("301.6"), "the restarted server left the orphans running"


def test_chaos_leaves_nothing_running_and_loses_nothing(client: Client) -> None:
    """A bounded mix, seeded: quick actions, detached escapes, timeouts, cancels and
    trajectory ends. Every accepted action ends; no core is granted twice at once; no process
    any action started is left."""
    rng = random.Random(7)
    ids: list[str] = []
    for i in range(60):
        traj = f"c{i % 6}"
        kind = rng.choice(["quick", "escape", "timeout", "hold"])
        if kind == "quick":
            command = ["sh", "-c", "echo $LOOM_CORES"]
        elif kind == "escape":
            command = _detach("302.1")
        else:
            command = _hold("302.2")
        timeout = 0.3 if kind == "timeout" else 20.0
        ids.append(client.submit(trajectory_id=traj, command=command, timeout_s=timeout))
        roll = rng.random()
        if roll < 0.15:
            client.http.delete(f"/v1/actions/{rng.choice(ids)}")
        elif roll < 0.2:
            client.http.post(f"/v1/trajectories/c{rng.randrange(6)}/end")
    time.sleep(1.0)  # the quick, escaping and timed-out ones end by themselves
    views = [v.json() for a in ids if (v := client.http.get(f"/v1/actions/{a}")).status_code == 200]
    for t in range(6):  # the rest end with their trajectories (which frees their records)
        client.http.post(f"/v1/trajectories/c{t}/end")
    # every accepted action reached a terminal state: the metrics counted each once
    text = client.http.get("/metrics").text
    finished = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("loom_actions_finished_total{")
    )
    assert finished == len(ids)
    views = [v for v in views if v["status"] not in ("queued", "running")]
    ran = [v for v in views if v["started_at"] is not None]
    for core in CORES:  # never two actions on one core at once
        spans = sorted((v["started_at"], v["finished_at"]) for v in ran if core in v["cores"])
        assert all(a[1] <= b[0] + 1e-3 for a, b in itertools.pairwise(spans)), core
    assert not wait_no_procs("302."), "processes of finished actions are still running"
    assert client.http.get("/v1/stats").json()["busy_cores"] == []
