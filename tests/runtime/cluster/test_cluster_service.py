"""`loom serve cluster` over real HTTP with real worker-process groups: two tiny jobs sharing
one node group (switches inserted, one operation at a time, results equal to running alone),
bad input refused with a reason, a deleted job's queued operations cancelled, and every
accepted operation terminal when the service stops."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

pytest.importorskip("torch")

import itertools
from typing import Any

import loom
from loom.client import ClusterClient, ClusterError, phase_of
from loom.runtime.cluster.app import BackgroundCluster, ClusterConfig
from loom.runtime.cluster.wpg import WorkerGroup, WorkerGroupConfig

pytestmark = [pytest.mark.torch, pytest.mark.slow]

BATCH = [[1, 5, 9, 3, 7, 2], [4, 4, 8, 1, 0, 6], [2, 3, 5, 7, 11, 13], [9, 8, 7, 6, 5, 4]]


def batch(seed: int, step: int) -> list[list[int]]:
    return [[(x * (seed + step + 1)) % 128 for x in row] for row in BATCH]


@loom.phase("rollout")  # a phase of whichever job is active when it runs
async def rollout(actor: Any) -> None:
    await actor.call("generate", ids=BATCH[:2], max_tokens=4)


async def job_loop(url: str, name: str, seed: int, steps: int) -> tuple[str, list[str]]:
    async with ClusterClient(url) as cluster:
        job = await cluster.job(name)
        actor = await job.deployment("actor", dp=2, seed=seed, group=0)

        @phase_of(job, "train")
        async def train(step: int) -> None:
            await actor.call(
                "forward_backward", ids=batch(seed, step), advantages=[1.0, -0.5, 0.25, 1.0]
            )
            await actor.call("optim_step")

        with pytest.raises(RuntimeError, match="inside `async with job:`"):
            await rollout(actor)  # no job is active yet
        async with job:
            for s in range(steps):
                await rollout(actor)
                await train(s)
        digest = (await actor.call("sync_weights"))["digest"]
        return digest, [p.name for p in job.phases]


@pytest.fixture
def service(tmp_path: Path):  # type: ignore[no-untyped-def]
    with BackgroundCluster(ClusterConfig(port=0, groups=1, state_dir=tmp_path)) as svc:
        svc.tmp = tmp_path
        yield svc


@pytest.mark.parametrize("policy", ["hrrs", "round_robin"])
def test_two_jobs_share_a_node_group_one_operation_at_a_time(policy, tmp_path: Path) -> None:
    """Under PlexRL's HRRS and under RollMux's round robin (the same runtime, another
    operation policy)."""
    steps = 2
    with BackgroundCluster(
        ClusterConfig(port=0, groups=1, policy=policy, state_dir=tmp_path / "svc")
    ) as service:
        _two_jobs(service, steps, tmp_path)


def _two_jobs(service: BackgroundCluster, steps: int, tmp_path: Path) -> None:

    async def both() -> list[tuple[str, list[str]]]:
        return await asyncio.gather(
            job_loop(service.url, "job-a", 1, steps), job_loop(service.url, "job-b", 2, steps)
        )

    (dig_a, phases_a), (dig_b, _) = asyncio.run(both())
    assert phases_a == ["rollout", "train"] * steps
    driver = service.app.state.driver
    stats = httpx.get(service.url + "/v1/stats").json()
    assert stats["counts"]["switches"] >= 1 and stats["counts"]["failed"] == 0
    ran = sorted(
        (r for r in driver.ops.values() if r.started_s is not None), key=lambda r: r.started_s
    )
    assert all(r.status.terminal for r in driver.ops.values())
    for a, b in itertools.pairwise(ran):
        assert b.started_s >= a.ended_s - 1e-6, f"{a.kind} and {b.kind} overlapped on the group"
    # each job's result is what it would have been alone, switches and all
    for name, seed, got in (("alone-a", 1, dig_a), ("alone-b", 2, dig_b)):
        with WorkerGroup(
            WorkerGroupConfig(name=name, dp=2, seed=seed, state_dir=tmp_path / name)
        ) as g:
            for s in range(steps):
                g.run("generate", {"ids": BATCH[:2], "max_tokens": 4})
                g.run(
                    "forward_backward",
                    {"ids": batch(seed, s), "advantages": [1.0, -0.5, 0.25, 1.0]},
                )
                g.run("optim_step")
            assert g.run("sync_weights")["digest"] == got
    metrics = httpx.get(service.url + "/metrics").text
    assert 'loom_cluster_ops{op="optim_step",status="succeeded"}' in metrics


def test_bad_input_is_refused_with_a_reason(service) -> None:
    http = httpx.Client(base_url=service.url, timeout=120)
    made = http.post("/v1/deployments", json={"job_id": "j", "layout": {"dp": 1}})
    assert made.status_code == 201, made.text
    dep = made.json()["id"]
    op = ("post", f"/v1/deployments/{dep}/ops")
    cases = [
        ("post", f"/v1/deployments/{dep}/ops", {"op": "train_harder"}, 400, "unknown operation"),
        ("post", "/v1/deployments/nope:actor/ops", {"op": "optim_step"}, 404, "no deployment"),
        ("post", "/v1/deployments", {"job_id": "j", "layout": {"dp": 1}}, 409, "exists already"),
        ("post", "/v1/deployments", {"job_id": "k", "group": 5}, 400, "no node group 5"),
        ("post", "/v1/deployments", {"job_id": "bad id!"}, 400, "job_id"),
        ("post", f"/v1/deployments/{dep}/ops", {"op": "forward", "extra": 1}, 400, "extra"),
        ("get", "/v1/ops/123456", None, 404, "no operation"),
        ("post", f"/v1/deployments/{dep}/ops", {"op": "save_ckpt"}, 400, "path: missing"),
        ("post", "/v1/deployments", {"job_id": "e", "estimates": {"fly": 1}}, 400, "estimates"),
        ("post", "/v1/deployments", {"job_id": "d", "layout": {"dp": 9}}, 400, "8 GPUs"),
        ("post", f"/v1/deployments/{dep}/migrate", {"group": 3}, 400, "no node group 3"),
        ("delete", "/v1/jobs/ghost", None, 404, "no deployment of job"),
        ("post", "/v1/deployments", {"job_id": "q", "model": "Qwen/Qwen3-8B"}, 400,
         "model 'Qwen/Qwen3-8B' is neither 'tiny' (the built-in decoder), a worker class"),
        ("post", "/v1/deployments", {"job_id": "q", "model": "no_such_pkg:Worker"}, 400,
         "no module 'no_such_pkg' is importable here"),
        # payloads the model cannot run are refused at submission, saying what is wrong
        (*op, {"op": "forward_backward", "payload": {"ids": [[1, 2, 300], [1, 2, 3]]}}, 400,
         "token id 300 at row 0, position 2 is outside the model's vocabulary [0, 128)"),
        (*op, {"op": "forward", "payload": {"ids": [[1, 2, 3], [1, 2]]}}, 400, "ragged batch"),
        (*op, {"op": "generate", "payload": {"ids": "x"}}, 400, "ids: Input should be a valid"),
        (*op, {"op": "generate", "payload": {"ids": [[1]], "max_tokens": "8"}}, 400,
         "max_tokens: Input should be a valid integer"),
        (*op, {"op": "forward", "payload": {"ids": [[1, True]]}}, 400, "ids[0][1]"),
        (*op, {"op": "optim_step", "payload": {"learning_rate": 0.1}}, 400,
         "learning_rate: not a field of this operation"),
        (*op, {"op": "sync_weights", "payload": {"tp": 3}}, 400, "tp=3 does not split"),
        (*op, {"op": "forward", "payload": {"ids": [[1, 2]]}, "deadline_s": 0}, 400, "deadline_s"),
        (*op, {"op": "inject_fault", "payload": {"rank": 0, "action": "raise"}}, 400, "unknown"),
    ]  # fmt: skip
    for method, path, body, status, words in cases:
        resp = http.request(method.upper(), path, json=body)
        assert resp.status_code == status and words in resp.text, (
            path,
            resp.status_code,
            resp.text,
        )
    # an operation the workers cannot do fails with its reason, and the group goes on
    op = http.post(
        f"/v1/deployments/{dep}/ops",
        json={"op": "load_ckpt", "payload": {"path": str(service.tmp / "no-such.pt")}},
    ).json()
    view = http.get(f"/v1/ops/{op['op_id']}", params={"wait_s": 60}).json()
    assert view["status"] == "failed" and "No such file" in view["error"], view
    ok = http.post(f"/v1/deployments/{dep}/ops", json={"op": "sync_weights"}).json()
    assert http.get(f"/v1/ops/{ok['op_id']}", params={"wait_s": 60}).json()["status"] == "succeeded"
    http.close()


def test_deleting_a_job_cancels_its_queued_operations(service) -> None:
    async def run() -> None:
        async with ClusterClient(service.url) as cluster:
            job = await cluster.job("doomed")
            actor = await job.deployment("actor", dp=1)
            ids = [await actor.submit("generate", ids=BATCH, max_tokens=200) for _ in range(6)]
            while (await cluster.op(ids[0]))["status"] == "queued":
                await asyncio.sleep(0.01)  # the first runs: the others wait behind it
            assert await job.delete() == ["doomed:actor"]
            views = [await cluster.op(i) for i in ids]
            assert all(v["status"] in ("succeeded", "cancelled") for v in views)
            assert any(v["status"] == "cancelled" for v in views)
            with pytest.raises(ClusterError, match="no deployment"):
                await actor.submit("optim_step")

    asyncio.run(run())


def test_a_job_deleted_as_the_next_jobs_switch_offloads_it_fails_nothing(service) -> None:
    """A job that deletes itself as soon as its last operation ends, while another job's
    operation switches the group away from it (two GRPO jobs, one finishing): it is
    forgotten once its offload is done, and no operation or step fails."""

    async def run() -> None:
        async with ClusterClient(service.url) as cluster:
            other = await (await cluster.job("next")).deployment("actor", dp=2, seed=2, group=0)
            for i in range(4):
                job = await cluster.job(f"done{i}")
                actor = await job.deployment("actor", dp=2, seed=1, group=0)
                await actor.call("forward", ids=BATCH[:2])  # resident now
                op_id = await other.submit("forward", ids=BATCH[:2])  # offloads it first
                assert await job.delete() == [f"done{i}:actor"]
                await other.result(op_id)

    asyncio.run(run())
    driver = service.app.state.driver
    failed = [r for r in driver.core.ops.values() if r.status.value == "failed"]
    assert not failed and driver.stats()["counts"]["failed"] == 0, failed


def test_stopping_the_service_leaves_every_operation_terminal(tmp_path: Path) -> None:
    svc = BackgroundCluster(ClusterConfig(port=0, state_dir=tmp_path)).start()
    http = httpx.Client(base_url=svc.url, timeout=120)
    dep = http.post("/v1/deployments", json={"job_id": "j"}).json()["id"]
    for _ in range(3):
        http.post(
            f"/v1/deployments/{dep}/ops",
            json={"op": "generate", "payload": {"ids": BATCH, "max_tokens": 100}},
        )
    http.close()
    svc.stop()
    records = svc.app.state.driver.ops.values()
    assert records and all(r.status.terminal for r in records)


def test_placement_cold_starts_on_own_groups_and_fits_profiled_traces(tmp_path: Path) -> None:
    """Cold start: each deployment gets a node group of its own while one is free. Warm
    start: a deployment with a profiled trace is fitted with the least phase shift, here into
    the first job's idle time on its group. Repacking moves a cold-started job by its trace."""

    async def run(url: str) -> None:
        async with ClusterClient(url) as cluster:
            a = await cluster.job("a")
            da = await a.deployment("actor", trace={"period_s": 100, "segments": [[0, 30]]})
            b = await cluster.job("b")
            db = await b.deployment("actor")  # no trace yet: cold start, a group of its own
            assert db.group != da.group
            c = await cluster.job("c")
            dc = await c.deployment("actor", trace={"period_s": 100, "segments": [[0, 40]]})
            stats = await cluster.stats()
            placed = stats["deployments"]["c:actor"]["placement"]
            first = stats["deployments"]["a:actor"]["placement"]
            assert dc.group == da.group
            assert placed["start_s"] == first["start_s"] + 30  # right after a's segment
            assert stats["deployments"]["b:actor"]["placement"]["dedicated"] is True
            # b profiled its cycle: it is repacked by its trace (and may leave its own group)
            for _ in range(3):
                async with b.phase("step"), b.phase("train"):
                    await db.call("optim_step")
            trace = b.trace("step", ("train",))
            assert trace is not None and trace["segments"][0][1] >= 1
            view = await db.profile({"period_s": 100, "segments": [[0, 20]]})
            assert view["placement"]["dedicated"] is False
            assert (await db.call("optim_step"))["step"] == 4  # it runs where it went
            with pytest.raises(ClusterError, match="invalid trace"):
                await db.profile({"period_s": 10, "segments": [[0, 20]]})

    with BackgroundCluster(ClusterConfig(port=0, groups=2, state_dir=tmp_path)) as svc:
        asyncio.run(run(svc.url))
