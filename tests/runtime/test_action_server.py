"""The action server with CPU tools: real uvicorn on loopback, real pinned processes."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from action_server_client import Client, max_overlap, procs_with, wait_no_procs

PY = sys.executable
CORES = sorted(os.sched_getaffinity(0))


def test_healthz_openapi_and_stats(client: Client) -> None:
    assert client.http.get("/healthz").json() == {"status": "ok"}
    paths = client.http.get("/openapi.json").json()["paths"]
    assert {
        "/v1/actions",
        "/v1/actions/{action_id}",
        "/v1/trajectories/{trajectory_id}/end",
    } <= set(paths)
    stats = client.http.get("/v1/stats").json()
    assert stats["cores"] == CORES and stats["busy_cores"] == []
    assert stats["gpu_services_available"] is False


def test_command_succeeds_with_stdout_and_times(client: Client) -> None:
    v = client.run(command=[PY, "-c", "print('hello'); import sys; print('err', file=sys.stderr)"])
    assert v["status"] == "succeeded" and v["exit_code"] == 0
    assert v["stdout"] == "hello\n" and v["stderr"] == "err\n"
    assert v["kind"] == "cpu_tool" and v["units"] == 1 and len(v["cores"]) == 1
    assert v["submitted_at"] <= v["scheduled_at"] <= v["started_at"] <= v["finished_at"]
    parts = v["queue_s"] + v["overhead_s"] + v["exec_s"]
    assert parts == pytest.approx(v["act_s"], abs=1e-6)


def test_failures_are_reported(client: Client) -> None:
    v = client.run(command=["sh", "-c", "echo oops >&2; exit 3"])
    assert (v["status"], v["exit_code"], v["stderr"]) == ("failed", 3, "oops\n")
    v = client.run(command=["/nonexistent/tool", "--flag"])
    assert v["status"] == "failed" and "cannot run '/nonexistent/tool'" in v["error"]


def test_workspace_persists_within_a_trajectory_until_it_ends(client: Client) -> None:
    wrote = client.run(trajectory_id="traj-a", command=["sh", "-c", "echo state > note.txt"])
    assert wrote["status"] == "succeeded"
    read = client.run(trajectory_id="traj-a", command=["cat", "note.txt"])
    assert read["stdout"] == "state\n"
    other = client.run(trajectory_id="traj-b", command=["cat", "note.txt"])
    assert other["status"] == "failed"
    ended = client.http.post("/v1/trajectories/traj-a/end").json()
    assert ended == {"trajectory_id": "traj-a", "cancelled": [], "workspace_removed": True}
    assert not (client.workdir / "traj-a").exists()
    again = client.run(trajectory_id="traj-a", command=["cat", "note.txt"])
    assert again["status"] == "failed"


@pytest.mark.parametrize("cpu", [1, len(CORES)])
def test_process_is_pinned_to_exactly_the_granted_cores(client: Client, cpu: int) -> None:
    probe = "import os; print(sorted(os.sched_getaffinity(0)))"
    v = client.run(command=[PY, "-c", probe], cpu=cpu)
    assert v["status"] == "succeeded"
    assert len(v["cores"]) == cpu and set(v["cores"]) <= set(CORES)
    assert v["stdout"].strip() == str(sorted(v["cores"]))


def test_elastic_action_gets_its_cores_in_parallel_env(client: Client) -> None:
    v = client.run(
        command=["sh", "-c", 'echo "$PARALLEL_NUM $LOOM_CORES"'],
        cpu={"min": 1, "max": 64},
        t_ori_s=10.0,
        elasticity="linear",
        parallel_env="PARALLEL_NUM",
    )
    # Alone on an idle machine, a linearly elastic action takes every core it may.
    assert v["units"] == min(64, len(CORES)) == len(v["cores"])
    count, cores = v["stdout"].split()
    assert int(count) == v["units"] and cores == ",".join(map(str, v["cores"]))


def test_never_more_running_actions_than_cores(make_client: Callable[..., Client]) -> None:
    cores = CORES[:4]
    client = make_client(cores=cores)
    n = 3 * len(cores)
    ids = [client.submit(trajectory_id=f"t{i}", command=["sleep", "0.2"]) for i in range(n)]
    views = [client.wait(i) for i in ids]
    assert all(v["status"] == "succeeded" and set(v["cores"]) <= set(cores) for v in views)
    assert max_overlap(views) == len(cores)
    for a in views:  # actions that overlap in time hold disjoint cores
        for b in views:
            overlap = a["started_at"] < b["finished_at"] and b["started_at"] < a["finished_at"]
            if a is not b and overlap:
                assert not set(a["cores"]) & set(b["cores"])


def test_timeout_kills_the_whole_process_group(client: Client) -> None:
    script = "sleep 30.101 & wait"
    v = client.run(trajectory_id="slow", command=["sh", "-c", script], timeout_s=0.5)
    assert v["status"] == "timed_out" and v["exit_code"] == -9
    assert 0.5 <= v["exec_s"] < 3.0
    assert not wait_no_procs("30.101"), "the action's processes survived the timeout"
    assert client.http.get("/v1/stats").json()["busy_cores"] == []


def test_an_action_ends_when_its_process_does(client: Client) -> None:
    # a background child holding the output pipes neither keeps the action running nor
    # outlives it
    v = client.run(trajectory_id="bg", command=["sh", "-c", "sleep 30.102 & echo done"])
    assert (v["status"], v["exit_code"], v["stdout"]) == ("succeeded", 0, "done\n")
    assert v["exec_s"] < 3.0
    assert not wait_no_procs("30.102")


def test_cancel_queued_then_running(client: Client) -> None:
    hog = client.submit(trajectory_id="hog", command=["sleep", "30"], cpu=len(CORES))
    client.wait_status(hog, "running")
    queued = client.submit(trajectory_id="q", command=["echo", "never"])
    time.sleep(0.05)
    assert client.view(queued)["status"] == "queued"
    r = client.http.delete(f"/v1/actions/{queued}")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert r.json()["started_at"] is None
    r = client.http.delete(f"/v1/actions/{hog}")
    assert r.json()["status"] == "cancelled"
    # Cancelling again changes nothing; the freed cores run the next action.
    assert client.http.delete(f"/v1/actions/{hog}").json()["status"] == "cancelled"
    assert client.run(command=["true"])["status"] == "succeeded"


def test_ending_a_trajectory_cancels_its_actions(client: Client) -> None:
    running = client.submit(trajectory_id="gone", command=["sleep", "30"], cpu=len(CORES))
    client.wait_status(running, "running")
    queued = client.submit(trajectory_id="gone", command=["true"])
    with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=client.server.url) as other:
        # a long-poll open on the running action
        waiting = pool.submit(lambda: other.get(f"/v1/actions/{running}?wait_s=30").json())
        time.sleep(0.1)
        ended = client.http.post("/v1/trajectories/gone/end").json()
        assert sorted(ended["cancelled"]) == sorted([running, queued])
        assert waiting.result(30)["status"] == "cancelled"  # it got the terminal record
    # ending a trajectory frees its records
    for aid in (running, queued):
        assert client.http.get(f"/v1/actions/{aid}").status_code == 404


def test_output_keeps_the_tail(make_client: Callable[..., Client]) -> None:
    client = make_client(max_output_bytes=1024)
    v = client.run(command=[PY, "-c", "print('x' * 5000 + 'END')"])
    assert v["output_truncated"] and len(v["stdout"]) == 1024 and v["stdout"].endswith("END\n")


def test_memory_limit_holds(client: Client) -> None:
    v = client.run(command=[PY, "-c", "b = bytearray(2 * 2**30)"], memory_gb=0.5)
    assert v["status"] == "failed"  # killed by the OOM killer in a cgroup, MemoryError without
    ok = client.run(command=[PY, "-c", "b = bytearray(2**20)"], memory_gb=0.5)
    assert ok["status"] == "succeeded"


def test_without_cgroups_memory_caps_each_process(make_client: Callable[..., Client]) -> None:
    client = make_client(cgroups=False)
    assert "cgroups are off" in client.http.get("/v1/stats").json()["containment_note"]
    v = client.run(command=[PY, "-c", "b = bytearray(2 * 2**30)"], memory_gb=0.5)
    assert v["status"] == "failed" and "MemoryError" in v["stderr"]


def _cmd(**fields: Any) -> dict[str, Any]:
    """A CPU action body with some fields changed."""
    return {"trajectory_id": "t", "command": ["true"], **fields}


BAD: list[tuple[str, Any, str]] = [
    ("malformed JSON", b'{"trajectory_id": "t", "command": [', "JSON decode error"),
    ("missing command", {"trajectory_id": "t"}, "missing command"),
    ("empty command", _cmd(command=[]), "at least 1"),
    ("command not a list", _cmd(command="ls"), "valid list"),
    ("negative cpu", _cmd(cpu=-1), "greater than"),
    ("cpu min > max", _cmd(cpu={"min": 3, "max": 2}), "must be >= cpu.min"),
    ("more cores than the machine", _cmd(cpu=100_000), "this server has"),
    ("negative memory", _cmd(memory_gb=-1), "greater than"),
    ("NaN timeout", b'{"trajectory_id": "t", "command": ["true"], "timeout_s": NaN}', "finite"),
    ("infinite memory", b'{"trajectory_id": "t", "command": ["x"], "memory_gb": 1e999}', "finite"),
    ("timeout beyond a day", _cmd(timeout_s=86_401), "less than or equal to 86400"),
    ("env key with =", _cmd(env={"A=B": "1"}), "cannot contain '='"),
    ("NUL in an env value", _cmd(env={"A": "x\x00y"}), "NUL byte"),
    ("NUL in the command", _cmd(command=["tr\x00ue"]), "NUL byte"),
    ("network refused", _cmd(network="yes please"), "valid boolean"),
    ("bad trajectory id", _cmd(trajectory_id="../etc"), "pattern"),
    ("zero timeout", _cmd(timeout_s=0), "greater than"),
    ("two kinds", _cmd(api={"name": "x", "url": "http://a"}), "exactly one"),
    ("unknown service", {"trajectory_id": "t", "service": {"name": "rm"}}, "unknown service"),
    ("unknown API quota", {"trajectory_id": "t", "api": {"name": "web", "url": "http://a/"}},
     "unknown API quota"),
    ("unknown elasticity", _cmd(elasticity="magic"), "unknown elasticity"),
    ("elasticity out of range", _cmd(elasticity={"1": 1.5}), "must be in (0, 1]"),
    ("elasticity table short", _cmd(cpu={"min": 1, "max": 2}, elasticity={"1": 1}),
     "no entry for units"),
    ("unknown field", _cmd(gpu=1), "Extra inputs"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "body", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_4xx_with_a_message(
    shared_client: Client, case: str, body: Any, message: str
) -> None:
    client = shared_client
    if isinstance(body, bytes):
        headers = {"content-type": "application/json"}
        r = client.http.post("/v1/actions", content=body, headers=headers)
    else:
        r = client.http.post("/v1/actions", json=body)
    assert 400 <= r.status_code < 500, (case, r.status_code, r.text)
    assert message in r.text, (case, r.text)
    assert client.http.get("/healthz").status_code == 200
    assert client.run(command=["true"])["status"] == "succeeded"


def test_unknown_action_is_404(client: Client) -> None:
    assert client.http.get("/v1/actions/act-nope").status_code == 404
    assert client.http.delete("/v1/actions/act-nope").status_code == 404
    assert client.http.post("/v1/trajectories/..%2Fx/end").status_code in (400, 404)


def test_shutdown_cancels_everything_it_accepted(make_client: Callable[..., Client]) -> None:
    client = make_client()
    script = "exec sleep 30.103"
    running = client.submit(trajectory_id="s", command=["sh", "-c", script], cpu=len(CORES))
    client.wait_status(running, "running")
    queued = [client.submit(trajectory_id=f"q{i}", command=["true"]) for i in range(3)]
    deadline = time.monotonic() + 3
    while not procs_with("30.103"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    client.server.stop()
    records = client.server.app.state.driver.records
    assert records[running].outcome.error == "the server shut down"
    assert {records[a].status.name for a in [running, *queued]} == {"CANCELLED"}
    assert not wait_no_procs("30.103")
