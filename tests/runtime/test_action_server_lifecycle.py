"""Bounded memory and a clean end: request bodies are capped, finished records are kept for a
bounded time and count and can be deleted, idle trajectories are ended, and a SIGTERM answers
every open long-poll with its action's terminal record."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from action_server_client import Client

CORES = sorted(os.sched_getaffinity(0))


def test_an_oversized_body_is_a_413(make_client: Callable[..., Client]) -> None:
    client = make_client(max_body_bytes=4096)
    big = {"trajectory_id": "t", "command": ["true"], "env": {"X": "y" * 10_000}}
    r = client.http.post("/v1/actions", json=big)
    assert r.status_code == 413 and "4096" in r.text

    def chunks() -> Iterator[bytes]:  # no Content-Length: the server counts as it reads
        yield b'{"trajectory_id": "t", "command": ["true"], "env": {"X": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}}'

    r = client.http.post(
        "/v1/actions", content=chunks(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413
    assert client.run(command=["true"])["status"] == "succeeded"


def test_delete_forgets_a_finished_action(client: Client) -> None:
    aid = client.submit(command=["true"])
    assert client.wait(aid)["status"] == "succeeded"
    r = client.http.delete(f"/v1/actions/{aid}")
    assert r.status_code == 200 and r.json()["status"] == "succeeded"
    assert client.http.get(f"/v1/actions/{aid}").status_code == 404


def test_records_are_kept_for_a_bounded_time_and_count(make_client: Callable[..., Client]) -> None:
    client = make_client(retain_s=0.3, retain_max=2)
    ids = []
    for _ in range(3):  # one after another: the first is the oldest to finish
        ids.append(client.submit(trajectory_id="r", command=["true"]))
        client.wait(ids[-1])
    assert client.http.get(f"/v1/actions/{ids[0]}").status_code == 404  # past retain_max
    deadline = time.monotonic() + 60  # past retain_s: forgotten (at the next sweep)
    while any(client.http.get(f"/v1/actions/{a}").status_code != 404 for a in ids[1:]):
        assert time.monotonic() < deadline, "finished actions outlived retain_s"
        time.sleep(0.1)


def test_an_idle_trajectory_is_ended(make_client: Callable[..., Client]) -> None:
    client = make_client(trajectory_idle_s=0.3)
    v = client.run(trajectory_id="idle", command=["sh", "-c", "echo x > state"], memory_gb=1)
    assert v["status"] == "succeeded" and (client.workdir / "idle" / "state").exists()
    deadline = time.monotonic() + 5
    while (client.workdir / "idle").exists():  # ended: its workspace, memory, records freed
        assert time.monotonic() < deadline, "the idle trajectory was not ended"
        time.sleep(0.05)
    assert client.http.get(f"/v1/actions/{v['id']}").status_code == 404
    # a busy trajectory is not ended under it
    busy = client.submit(trajectory_id="busy", command=["sleep", "1.5"])
    assert client.wait(busy)["status"] == "succeeded"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("sandbox", ["none"])
def test_sigterm_answers_open_long_polls(tmp_path: object, sandbox: str) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-c", "from loom.cli import app; app()", "serve", "actions"]
    cmd += ["--port", str(port), "--workdir", str(tmp_path), "--sandbox", sandbox]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(base_url=url, trust_env=False, timeout=60) as http:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
            body = {"trajectory_id": "t", "command": ["sleep", "30"]}
            running = http.post("/v1/actions", json=body).json()["id"]
            queued = [
                http.post("/v1/actions", json={**body, "cpu": 2}).json()["id"] for _ in range(2)
            ]
            with ThreadPoolExecutor(3) as pool:
                polls = [
                    pool.submit(http.get, f"/v1/actions/{a}", params={"wait_s": 50})
                    for a in [running, *queued]
                ]
                time.sleep(0.3)
                t0 = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                answers = [p.result(30) for p in polls]
            assert time.monotonic() - t0 < 10  # not the long-polls' 50 s
            assert [a.status_code for a in answers] == [200, 200, 200]
            assert {a.json()["status"] for a in answers} == {"cancelled"}
            assert {a.json()["error"] for a in answers} == {"the server shut down"}
        assert proc.wait(30) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores")
def test_an_action_that_does_not_fit_lets_later_ones_start(
    make_client: Callable[..., Client],
) -> None:
    client = make_client(backfill_s=1.0)
    one = client.submit(trajectory_id="a", command=["sleep", "120"])  # holds a core until cancelled
    client.wait_status(one, "running")
    big = client.submit(trajectory_id="b", command=["true"], cpu=len(CORES))  # cannot fit yet
    small = client.submit(trajectory_id="c", command=["true"])  # fits beside `one`
    assert client.wait(small, timeout_s=5)["status"] == "succeeded"
    assert client.view(big)["status"] == "queued"
    time.sleep(1.2)  # `big` has now waited past backfill_s: it blocks what comes after it
    late = client.submit(trajectory_id="d", command=["true"])
    time.sleep(0.3)  # (a wrong scheduler would start `late` at once)
    assert client.view(late)["status"] == "queued"
    assert client.http.delete(f"/v1/actions/{one}").json()["status"] == "cancelled"
    done = {a: client.wait(a, timeout_s=60) for a in (big, late)}
    assert done[big]["finished_at"] <= done[late]["started_at"] + 1e-3  # no starvation


def test_backfill_zero_is_strict_fcfs(make_client: Callable[..., Client]) -> None:
    client = make_client(backfill_s=0)
    one = client.submit(trajectory_id="a", command=["sleep", "1"])
    client.wait_status(one, "running")
    big = client.submit(trajectory_id="b", command=["true"], cpu=len(CORES))
    small = client.submit(trajectory_id="c", command=["true"])
    views = {a: client.wait(a, timeout_s=10) for a in (one, big, small)}
    assert views[big]["started_at"] <= views[small]["started_at"]


def test_the_server_drives_only_its_policies() -> None:
    from loom.runtime.actions import ActionServerConfig

    with pytest.raises(ValueError, match="runs only in the simulator"):
        ActionServerConfig(policy="k8s")
