"""Worker-process groups as Ray actors on a local Ray with fake GPUs: a deployment's ranks in
one placement group, training in step, state moved bit for bit, the placement group gone with
the group, a deployment the cluster cannot place refused in time, and the cluster service
driving Ray-launched deployments."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")

from loom.runtime.cluster.app import BackgroundCluster, ClusterConfig
from loom.runtime.cluster.wpg import GroupBroken, RankFailed, WorkerError, WorkerGroupConfig

pytestmark = [
    pytest.mark.ray,
    pytest.mark.torch,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs the ray extra"),
]

BATCH = [[1, 5, 9, 3, 7, 2], [4, 4, 8, 1, 0, 6]]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    import ray

    ray.init(
        num_gpus=4,
        num_cpus=4,
        object_store_memory=100 * 2**20,
        include_dashboard=False,
        namespace="loom-cluster-test",
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()


def test_a_deployment_runs_as_ray_actors_in_one_placement_group(
    ray_cluster, tmp_path: Path
) -> None:
    from ray.util import placement_group_table

    from loom.runtime.cluster.ray_wpg import RayWorkerGroup

    cfg = WorkerGroupConfig(name="ray-a", dp=2, seed=3, state_dir=tmp_path)
    with RayWorkerGroup(cfg, gpus_per_rank=1.0) as g:
        pgs = [p for p in placement_group_table().values() if p["state"] == "CREATED"]
        assert len(pgs) == 1 and len(pgs[0]["bundles"]) == 2
        assert pgs[0]["bundles"][0].get("GPU") == 1.0
        g.run("forward_backward", {"ids": BATCH})
        g.run("optim_step")
        digest = g.run("sync_weights")["digest"]  # both ranks agree (checked by the group)
        written = g.run("offload", {"tier": "disk"})["bytes"]
        # the node's sidecar (one Ray node here) holds the two replicas' state once
        (node,) = g.state("stats")
        assert len(node["deployments"]["ray-a"]["ranks"]) == 2
        assert node["bytes_by_tier"]["disk"] == node["unique_logical_bytes"] == written > 0
        with pytest.raises(WorkerError, match="offloaded"):
            g.run("forward", {"ids": BATCH})
        g.run("load")
        assert g.run("sync_weights")["digest"] == digest
    assert not [p for p in placement_group_table().values() if p["state"] == "CREATED"]


def test_a_ray_rank_that_raises_fails_the_operation_without_waiting(
    ray_cluster, tmp_path: Path
) -> None:
    """Rank 1 raises while rank 0 waits for it in an all-reduce: the operation fails with rank
    1's error at once; rank 0 never settles, and the group is killed."""
    from loom.runtime.cluster.ray_wpg import RayWorkerGroup

    cfg = WorkerGroupConfig(name="ray-f", dp=2, state_dir=tmp_path, faults=True, settle_s=0.5)
    g = RayWorkerGroup(cfg, gpus_per_rank=1.0).start()
    try:
        with pytest.raises(RankFailed, match="rank 1: RuntimeError: injected fault") as err:
            g.run("inject_fault", {"rank": 1, "action": "raise"})
        assert err.value.pending == {0}
        assert not g.settle(0.5)
        with pytest.raises(GroupBroken, match="never finished"):
            g.run("sync_weights")
        g.kill()
        assert not g.alive
    finally:
        g.close()


def test_a_deployment_the_cluster_cannot_place_is_refused_in_time(
    ray_cluster, tmp_path: Path
) -> None:
    from loom.runtime.cluster.ray_wpg import RayWorkerGroup

    cfg = WorkerGroupConfig(name="too-big", dp=2, state_dir=tmp_path)
    with pytest.raises(WorkerError, match="did not place"):
        RayWorkerGroup(cfg, gpus_per_rank=3.0, placement_timeout_s=3).start()


def test_the_cluster_service_drives_ray_launched_deployments(ray_cluster, tmp_path: Path) -> None:
    settings = ClusterConfig(port=0, launcher="ray", gpus_per_rank=1.0, state_dir=tmp_path)
    with BackgroundCluster(settings) as svc, httpx.Client(base_url=svc.url, timeout=300) as http:
        made = http.post("/v1/deployments", json={"job_id": "r", "layout": {"dp": 2}})
        assert made.status_code == 201, made.text
        dep = made.json()["id"]
        op = http.post(
            f"/v1/deployments/{dep}/ops", json={"op": "forward", "payload": {"ids": BATCH}}
        )
        view = http.get(f"/v1/ops/{op.json()['op_id']}", params={"wait_s": 120}).json()
        assert view["status"] == "succeeded" and len(view["result"]["logprobs"]) == 2
        assert http.delete("/v1/jobs/r").status_code == 200


def test_the_service_runs_as_a_named_detached_actor(ray_cluster, tmp_path: Path) -> None:
    from loom.runtime.cluster.ray_service import connect_service, deploy_service, shutdown_service

    settings = ClusterConfig(port=0, gpus_per_rank=1.0, state_dir=tmp_path)
    actor, url = deploy_service(settings, namespace="loom-cluster-test")
    try:
        _, found = connect_service(namespace="loom-cluster-test")  # any driver finds it by name
        assert found == url
        with httpx.Client(base_url=url, timeout=300) as http:
            made = http.post("/v1/deployments", json={"job_id": "d", "layout": {"dp": 1}})
            assert made.status_code == 201, made.text
            dep = made.json()["id"]
            op = http.post(f"/v1/deployments/{dep}/ops", json={"op": "sync_weights"}).json()
            view = http.get(f"/v1/ops/{op['op_id']}", params={"wait_s": 120}).json()
            assert view["status"] == "succeeded"
    finally:
        shutdown_service(actor)
    from ray.util import placement_group_table

    assert not [p for p in placement_group_table().values() if p["state"] == "CREATED"]
