"""`loom serve cluster` under faults, over real HTTP and real worker processes: a rank that
raises, a rank wedged in a collective, a rank SIGKILLed while its job is resident and while it
is offloaded, a job deleted mid-operation — each while two other jobs share the node group and
keep running; deadlines from estimates, measurements or the caller; and the service SIGKILLed
through its CLI, taking its workers and sidecar with it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")

from cluster_procs import descendants, gone, wait_gone

from loom.runtime.cluster.app import BackgroundCluster, ClusterConfig

pytestmark = [pytest.mark.torch, pytest.mark.slow]

BATCH = [[1, 5, 9, 3, 7, 2], [4, 4, 8, 1, 0, 6]]


class Api:
    """The service over plain HTTP, as a user meets it."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=300, trust_env=False)

    def deploy(self, job: str, dp: int = 1, **kw: Any) -> str:
        body = {"job_id": job, "layout": {"dp": dp}, "group": 0, **kw}
        resp = self.http.post("/v1/deployments", json=body)
        assert resp.status_code == 201, resp.text
        return str(resp.json()["id"])

    def submit(self, dep: str, op: str, deadline_s: float | None = None, **payload: Any) -> int:
        body: dict[str, Any] = {"op": op, "payload": payload}
        if deadline_s is not None:
            body["deadline_s"] = deadline_s
        resp = self.http.post(f"/v1/deployments/{dep}/ops", json=body)
        assert resp.status_code == 202, resp.text
        return int(resp.json()["op_id"])

    def wait(self, op_id: int) -> dict[str, Any]:
        deadline = time.monotonic() + 600
        while True:
            view: dict[str, Any] = self.http.get(f"/v1/ops/{op_id}", params={"wait_s": 30}).json()
            if view["status"] in ("succeeded", "failed", "cancelled"):
                return view
            assert time.monotonic() < deadline, f"operation {op_id} never ended: {view}"

    def ok(self, op_id: int) -> dict[str, Any]:
        view = self.wait(op_id)
        assert view["status"] == "succeeded", view
        return dict(view["result"])

    def dep(self, dep: str) -> dict[str, Any]:
        return dict(self.http.get("/v1/stats").json()["deployments"][dep])

    def traffic(self, deps: list[str], steps: int = 2) -> list[int]:
        """The other jobs' training steps, queued on the group."""
        ids = []
        for s in range(steps):
            for dep in deps:
                ids.append(self.submit(dep, "forward_backward", ids=BATCH, advantages=[1.0, -s]))
                ids.append(self.submit(dep, "optim_step"))
        return ids


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, list[str]]]:
    """One node group, two jobs that keep training on it; no watchdog, so that a dead rank
    is met where a user's next operation meets it (the switch to or away from its job)."""
    root = tmp_path_factory.mktemp("faults")
    cfg = ClusterConfig(port=0, state_dir=root, faults=True, settle_s=2.0, watch_s=0)
    with BackgroundCluster(cfg) as service:
        api = Api(service.url)
        others = [api.deploy("a", seed=1), api.deploy("c", seed=3)]
        yield api, others
        api.http.close()


def test_a_rank_that_raises_fails_its_job_at_once_and_not_the_others(svc) -> None:
    api, others = svc
    victim = api.deploy("raiser", dp=2)
    api.ok(api.submit(victim, "forward", ids=BATCH))
    before = api.traffic(others)
    # rank 1 raises while rank 0 waits for it in an all-reduce: with an hour's deadline, only
    # noticing the first error (not waiting for every rank) ends it
    bad = api.submit(victim, "inject_fault", deadline_s=3600, rank=1, action="raise")
    queued = api.submit(victim, "forward", ids=BATCH)
    after = api.traffic(others)
    view = api.wait(bad)
    assert view["status"] == "failed"
    assert "rank 1: RuntimeError: injected fault on rank 1" in view["error"], view
    behind = api.wait(queued)
    assert behind["status"] == "failed" and "raiser:actor failed" in behind["error"], behind
    for op in before + after:
        api.ok(op)
    st = api.dep(victim)
    assert st["status"] == "failed" and "injected fault" in st["error"]
    assert "not restarted" in st["error"]  # it was resident: its state was on its ranks
    assert st["pids"] == []
    refused = api.http.post(f"/v1/deployments/{victim}/ops", json={"op": "sync_weights"})
    assert refused.status_code == 409 and "failed" in refused.text
    assert api.http.delete("/v1/jobs/raiser").status_code == 200


def test_a_rank_wedged_in_a_collective_is_torn_down_at_its_deadline(svc) -> None:
    api, others = svc
    victim = api.deploy("wedged", dp=2)
    api.ok(api.submit(victim, "forward", ids=BATCH))
    pids = set(api.dep(victim)["pids"])
    bad = api.submit(victim, "inject_fault", deadline_s=3, rank=1, action="hang")
    queued = api.submit(victim, "forward", ids=BATCH)
    ops = api.traffic(others)
    view = api.wait(bad)
    assert view["status"] == "failed" and view["deadline_s"] == 3
    assert "inject_fault ran past its deadline of 3 s" in view["error"], view
    assert "wedged:actor failed" in api.wait(queued)["error"]
    for op in ops:
        api.ok(op)
    assert not wait_gone(pids, 30), "the wedged group's ranks live on"
    assert api.dep(victim)["status"] == "failed"
    assert api.http.delete("/v1/jobs/wedged").status_code == 200


def test_a_killed_rank_of_the_resident_job_fails_it_and_the_switch_goes_on(svc) -> None:
    api, others = svc
    victim = api.deploy("killed", dp=2)
    api.ok(api.submit(victim, "forward", ids=BATCH))  # resident now
    pids = api.dep(victim)["pids"]
    os.kill(pids[1], signal.SIGKILL)
    assert not wait_gone({pids[1]}, 30)
    # the next job's switch would offload the victim through its ranks: it drops it instead
    for op in api.traffic(others):
        api.ok(op)
    st = api.dep(victim)
    assert st["status"] == "failed", st
    assert f"rank 1 (pid {pids[1]}) was killed by SIGKILL" in st["error"]
    assert not wait_gone(set(pids), 30)
    state = api.http.get("/v1/state").json()["groups"]["0"]["deployments"]
    assert "killed-actor" not in state  # its state is dropped from the node's sidecar
    assert api.http.delete("/v1/jobs/killed").status_code == 200


def test_a_killed_rank_of_an_offloaded_job_is_restarted_from_its_offloaded_state(svc) -> None:
    api, others = svc
    victim = api.deploy("phoenix", dp=2, seed=7)
    api.ok(api.submit(victim, "forward_backward", ids=BATCH, advantages=[1.0, -0.5]))
    api.ok(api.submit(victim, "optim_step"))
    saved = api.ok(api.submit(victim, "sync_weights"))
    for op in api.traffic(others, steps=1):  # the victim is offloaded for them
        api.ok(op)
    state = api.http.get("/v1/state").json()["groups"]["0"]["deployments"]
    assert state["phoenix-actor"]["loaded"] is False
    pids = api.dep(victim)["pids"]
    os.kill(pids[0], signal.SIGKILL)
    assert not wait_gone({pids[0]}, 30)
    ops = api.traffic(others, steps=1)
    # its load meets the dead rank: the group is torn down and started again with the state
    # the sidecar holds (weights, Adam moments, step), then loaded and run
    again = api.ok(api.submit(victim, "sync_weights"))
    assert again == saved
    st = api.dep(victim)
    assert st["status"] == "ready" and st["restarts"] == 1
    assert not set(st["pids"]) & set(pids)
    assert not wait_gone(set(pids), 30)
    api.ok(api.submit(victim, "forward_backward", ids=BATCH))  # it trains on
    assert api.ok(api.submit(victim, "optim_step"))["step"] == 2
    for op in ops:
        api.ok(op)
    assert api.http.get("/v1/stats").json()["counts"]["restarts"] >= 1
    assert api.http.delete("/v1/jobs/phoenix").status_code == 200


def test_deleting_a_job_whose_operation_is_wedged_frees_its_group(svc) -> None:
    api, others = svc
    victim = api.deploy("stuck", dp=2)
    api.ok(api.submit(victim, "forward", ids=BATCH))
    pids = set(api.dep(victim)["pids"])
    bad = api.submit(victim, "inject_fault", deadline_s=3600, rank=0, action="hang")
    while api.http.get(f"/v1/ops/{bad}").json()["status"] == "queued":
        time.sleep(0.05)
    ops = api.traffic(others, steps=1)
    resp = api.http.delete("/v1/jobs/stuck")  # (had it waited for the hour, this would hang)
    assert resp.status_code == 200, resp.text
    view = api.wait(bad)
    assert view["status"] == "cancelled" and "deleted" in view["error"]
    for op in ops:
        api.ok(op)
    assert not wait_gone(pids, 30)


def test_deadlines_come_from_estimates_measurements_or_the_call(svc) -> None:
    api, _ = svc
    dep = api.deploy("timed", estimates={"forward": 30.0, "generate": 0.5})
    first = api.wait(api.submit(dep, "forward", ids=BATCH))
    assert first["deadline_s"] == 300.0  # 10 × the profiled 30 s
    took = first["ended_s"] - first["started_s"]
    view = api.wait(api.submit(dep, "forward", ids=BATCH))  # 10 × the measured, or the floor
    assert 120.0 <= view["deadline_s"] <= max(120.0, 10 * took + 1e-3)
    assert api.wait(api.submit(dep, "generate", ids=BATCH))["deadline_s"] == 120.0
    assert api.wait(api.submit(dep, "forward", deadline_s=45, ids=BATCH))["deadline_s"] == 45
    assert api.http.delete("/v1/jobs/timed").status_code == 200


def test_the_watchdog_finds_a_rank_that_died_while_its_job_was_idle(tmp_path: Path) -> None:
    cfg = ClusterConfig(port=0, state_dir=tmp_path, watch_s=0.5)
    with BackgroundCluster(cfg) as service:
        api = Api(service.url)
        dep = api.deploy("idle", dp=2)
        api.ok(api.submit(dep, "forward", ids=BATCH))
        pid = api.dep(dep)["pids"][1]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while api.dep(dep)["status"] != "failed":
            assert time.monotonic() < deadline, api.dep(dep)
            time.sleep(0.1)
        assert "killed by SIGKILL" in api.dep(dep)["error"]
        api.http.close()


def test_a_dead_sidecar_fails_its_nodes_deployments_and_a_new_one_starts(tmp_path: Path) -> None:
    """The node's StateManager sidecar is SIGKILLed: the offloaded job's state went with it and
    no job there can move state any more; both are failed saying why, and the next deployment
    on the group gets a new sidecar and runs."""
    cfg = ClusterConfig(port=0, state_dir=tmp_path, watch_s=0.5)
    with BackgroundCluster(cfg) as service:
        api = Api(service.url)
        resident, offloaded = api.deploy("x"), api.deploy("y")
        api.ok(api.submit(resident, "forward", ids=BATCH))
        sidecar = service.app.state.driver.launcher.sidecar(0)
        os.kill(sidecar.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while {api.dep(d)["status"] for d in (resident, offloaded)} != {"failed"}:
            assert time.monotonic() < deadline, api.http.get("/v1/stats").json()
            time.sleep(0.1)
        assert f"sidecar (pid {sidecar.pid}) exited (-9)" in api.dep(offloaded)["error"]
        fresh = api.deploy("z")
        api.ok(api.submit(fresh, "forward", ids=BATCH))
        assert service.app.state.driver.launcher.sidecar(0).pid != sidecar.pid
        api.http.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_killing_the_service_kills_its_workers_and_sidecars(tmp_path: Path) -> None:
    """`loom serve cluster` SIGKILLed (as an out-of-memory killer does) while a deployment's
    ranks compute: nothing it started is left, and nothing answers on its port."""
    port = _free_port()
    cmd = [sys.executable, "-c", "from loom.cli import app; app()", "serve", "cluster"]
    cmd += ["--port", str(port), "--state-dir", str(tmp_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    children: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "it did not start"
            time.sleep(0.1)
        api = Api(url)
        dep = api.deploy("long", dp=2)
        ranks = set(api.dep(dep)["pids"])
        op = api.submit(dep, "generate", ids=BATCH, max_tokens=4096)  # minutes of work
        while api.http.get(f"/v1/ops/{op}").json()["status"] != "running":
            time.sleep(0.05)
        api.http.close()
        children = descendants(proc.pid)
        assert ranks < children  # the ranks and the node's sidecar
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert not wait_gone(children, 60), "a worker or sidecar outlived the service"
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/healthz", trust_env=False, timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in children:
            if not gone(p):
                os.kill(p, signal.SIGKILL)
