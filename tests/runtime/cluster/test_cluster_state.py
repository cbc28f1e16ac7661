"""The cluster service and its nodes' StateManager sidecars, over real HTTP and real worker
processes: the scheduler's plan reaches the sidecar and the next switch's state is prefetched
from disk while the current operation runs; an offloaded deployment is checkpointed from the
sidecar without a switch while another job runs; a deployment migrates to another node group
with its weights, optimizer moments and step, and trains on bit-identical to one that stayed;
nothing is lost through spills, and no tier goes over its capacity."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import httpx
import pytest

torch = pytest.importorskip("torch")

from loom.client import ClusterClient, ClusterError  # noqa: E402
from loom.runtime.cluster.app import BackgroundCluster, ClusterConfig  # noqa: E402
from loom.runtime.cluster.model import TinyDecoder, TinyDecoderSpec  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

BATCH = [[1, 5, 9, 3, 7, 2], [4, 4, 8, 1, 0, 6]]
WEIGHTS = 116_480 * 4  # the tiny decoder's parameters, float32


def fresh_digest(seed: int) -> str:
    """What sync_weights reports for an untouched model of this seed."""
    h = hashlib.sha256()
    for name, t in sorted(TinyDecoder(TinyDecoderSpec(seed=seed)).state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def test_plan_prefetch_and_checkpoints_from_offloaded_state(tmp_path: Path) -> None:
    """One node group whose host tier holds one deployment's weights, not two. C and B start
    offloaded (B's offload spills part of C to disk). While A runs, B then C call: HRRS runs B
    first, and C's spilled state comes back to host while B runs — C's load then reads none of
    it from disk. Later, with C running, B is checkpointed straight from the sidecar."""
    cfg = ClusterConfig(port=0, groups=1, state_dir=tmp_path, host_bytes=WEIGHTS * 3 // 2)

    async def main(url: str) -> None:
        async with ClusterClient(url) as cluster:
            a = await (await cluster.job("A")).deployment(seed=1)
            c = await (await cluster.job("C")).deployment(seed=3)
            b = await (await cluster.job("B")).deployment(seed=2)
            st = (await cluster.state())["groups"]["0"]
            assert st["deployments"]["C-actor"]["bytes"]["disk"] > 0  # spilled by B's offload
            assert st["bytes_by_tier"]["host"] <= cfg.host_bytes
            long = await a.submit("generate", ids=BATCH, max_tokens=400)
            await asyncio.sleep(0.2)
            b_op = await b.submit("generate", ids=BATCH, max_tokens=400)
            c_op = await c.submit("sync_weights")
            await a.result(long)
            await b.result(b_op)
            assert (await c.result(c_op))["digest"] == fresh_digest(3)
            stats = await cluster.stats()
            st = (await cluster.state())["groups"]["0"]
            prefetched = stats["counts"]["prefetched_bytes"]
            assert prefetched > 0 and st["moved_bytes"]["disk->host"] == prefetched
            assert st["plan"][0] == "C-actor"  # the plan of the last switch reached the sidecar
            assert st["bytes_by_tier"]["host"] <= cfg.host_bytes
            assert st["deployments"]["C-actor"]["loaded"]

            # B is offloaded and idle: its checkpoint comes from the sidecar while C runs
            switches = stats["counts"]["switches"]
            busy = await c.submit("generate", ids=BATCH, max_tokens=400)
            await asyncio.sleep(0.2)
            ck = await b.submit("save_ckpt", path=str(tmp_path / "b.pt"))
            done = await b.result(ck)
            assert done["from"] == "offloaded state" and done["tensors"] > 0
            ck_view, busy_view = await cluster.op(ck), await cluster.op(busy, wait_s=60)
            assert ck_view["ended_s"] < busy_view["ended_s"]  # C's operation ran on meanwhile
            assert (await cluster.stats())["counts"]["switches"] == switches
            saved = torch.load(tmp_path / "b.pt")
            want = TinyDecoder(TinyDecoderSpec(seed=2)).state_dict()
            for name, t in want.items():
                assert torch.equal(saved[f"weights/{name}"], t)
            assert (await b.call("sync_weights"))["digest"] == fresh_digest(2)
            assert (await a.call("sync_weights"))["digest"] == fresh_digest(1)

    with BackgroundCluster(cfg) as svc:
        asyncio.run(main(svc.url))


def test_a_deployment_migrates_with_its_state_and_trains_on_identically(tmp_path: Path) -> None:
    """X and Y (the same seed) train a step on groups 0 and 1; X moves to group 1, where Y is
    resident; both train another step: their weights agree bit for bit, so X's weights, Adam
    moments and step all came across. Group 0's sidecar forgets X; X's old ranks are gone."""
    cfg = ClusterConfig(port=0, groups=2, state_dir=tmp_path)
    adv = [1.0, -0.5]

    async def step(dep, s: int) -> None:  # type: ignore[no-untyped-def]
        ids = [[(v * (s + 3)) % 128 for v in row] for row in BATCH]
        await dep.call("forward_backward", ids=ids, advantages=adv)
        await dep.call("optim_step")

    async def main(url: str) -> None:
        async with ClusterClient(url) as cluster:
            x = await (await cluster.job("X")).deployment(dp=2, seed=5, group=0)
            y = await (await cluster.job("Y")).deployment(dp=2, seed=5, group=1)
            for d in (x, y):
                await step(d, 0)
            old_pids = (await cluster.stats())["deployments"]["X:actor"]["pids"]
            busy = await x.submit("generate", ids=BATCH, max_tokens=200)
            async with httpx.AsyncClient(base_url=url) as http:
                r = await http.post("/v1/deployments/X:actor/migrate", json={"group": 1})
                assert r.status_code == 409 and "between steps" in r.json()["detail"]
                await x.result(busy)
                r = await http.post("/v1/deployments/X:actor/migrate", json={"group": 7})
                assert r.status_code == 400 and "no node group 7" in r.json()["detail"]
            moved = await x.migrate(1)
            assert moved["group"] == 1 and x.group == 1
            for pid in old_pids:
                with pytest.raises(ProcessLookupError):
                    os.kill(pid, 0)
            st = await cluster.state()
            assert "X-actor" not in st["groups"]["0"]["deployments"]
            assert not st["groups"]["1"]["deployments"]["X-actor"]["loaded"]
            assert (await x.call("sync_weights"))["version"] == 1  # its step came along
            for d in (x, y):
                await step(d, 1)
            dx, dy = await x.call("sync_weights"), await y.call("sync_weights")
            assert dx == dy
            assert (await cluster.stats())["counts"]["migrations"] == 1

    with BackgroundCluster(cfg) as svc:
        asyncio.run(main(svc.url))


def test_a_dead_resident_job_does_not_fail_the_switch_and_loses_nothing(tmp_path: Path) -> None:
    """A's worker dies while A is resident: B's next operation needs A offloaded first, which
    A's ranks cannot do. The switch does not depend on them: A is torn down and failed with
    the reason (its state, on its ranks, is dropped from the sidecar), B loads with its state
    intact and runs. A second deployment whose state would be named like B's on the node is
    refused."""
    cfg = ClusterConfig(port=0, groups=1, state_dir=tmp_path, watch_s=0)

    async def main(url: str) -> None:
        async with ClusterClient(url) as cluster:
            a = await (await cluster.job("A")).deployment(seed=1)
            b = await (await cluster.job("B")).deployment("x-y", seed=2)
            async with httpx.AsyncClient(base_url=url) as http:
                r = await http.post("/v1/deployments", json={"job_id": "B-x", "role": "y"})
                assert r.status_code == 409 and "name" in r.json()["detail"]
            (pid,) = (await cluster.stats())["deployments"]["A:actor"]["pids"]
            os.kill(pid, 9)
            assert (await b.call("sync_weights"))["digest"] == fresh_digest(2)
            stats = await cluster.stats()
            assert stats["groups"][0]["resident"] == "B:x-y"
            dead = stats["deployments"]["A:actor"]
            assert dead["status"] == "failed" and "killed by SIGKILL" in dead["error"]
            assert "A-actor" not in (await cluster.state())["groups"]["0"]["deployments"]
            with pytest.raises(ClusterError, match="A:actor failed"):
                await a.submit("sync_weights")
            assert await (await cluster.job("A")).delete() == ["A:actor"]

    with BackgroundCluster(cfg) as svc:
        asyncio.run(main(svc.url))
