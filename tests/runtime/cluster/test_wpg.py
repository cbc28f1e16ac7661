"""Worker-process groups for real: two gloo ranks training the tiny decoder, replicas in step,
one operation at a time, offload to host or disk and back bit for bit, refusal to compute while
offloaded, checkpoints, a killed worker, and two jobs multiplexed on one node with forced
switches ending bit-identical to each run alone (Loom's Fig. 7a)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from loom.core.errors import ConfigError  # noqa: E402
from loom.runtime.cluster.wpg import (  # noqa: E402
    GroupBroken,
    WorkerError,
    WorkerGroup,
    WorkerGroupConfig,
)

pytestmark = [pytest.mark.torch, pytest.mark.slow]

BATCH = [[1, 5, 9, 3, 7, 2], [4, 4, 8, 1, 0, 6], [2, 3, 5, 7, 11, 13], [9, 8, 7, 6, 5, 4]]


def train(g: WorkerGroup, steps: int, seed: int) -> list[float]:
    losses = []
    for s in range(steps):
        batch = [[(x * (seed + s + 1)) % 128 for x in row] for row in BATCH]
        losses.append(
            g.run("forward_backward", {"ids": batch, "advantages": [1.0, -0.5, 0.25, 1.0]})["loss"]
        )
        g.run("optim_step")
    return losses


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("wpg")
    a = WorkerGroup(WorkerGroupConfig(name="job-a", dp=2, seed=1, state_dir=root / "a")).start()
    b = WorkerGroup(WorkerGroupConfig(name="job-b", dp=2, seed=2, state_dir=root / "b")).start()
    yield a, b, root
    a.close()
    b.close()


def test_two_ranks_train_in_step_and_match_one_rank(pair, tmp_path: Path) -> None:
    a, _, _ = pair
    before = a.run("sync_weights")
    train(a, 3, seed=0)
    after = a.run("sync_weights")  # every replica agrees (the group checks the digests)
    assert after["version"] == before["version"] + 3 and after["digest"] != before["digest"]
    with WorkerGroup(WorkerGroupConfig(name="solo", dp=1, seed=1, state_dir=tmp_path)) as solo:
        train(solo, 3, seed=0)
        ref = solo.run("forward", {"ids": BATCH})["logprobs"]
    got = a.run("forward", {"ids": BATCH})["logprobs"]
    # the rows' gradients are summed across ranks: the same update as one rank's, to rounding
    assert torch.allclose(torch.tensor(got), torch.tensor(ref), atol=1e-5)


def test_offload_to_host_or_disk_and_back_is_bit_identical(pair) -> None:
    a, _, _ = pair
    train(a, 1, seed=5)
    ref = a.run("sync_weights")["digest"]
    logprobs = a.run("forward", {"ids": BATCH})["logprobs"]
    for tier in ("host", "disk"):
        written = a.run("offload", {"tier": tier})["bytes"]
        (st,) = a.state("stats")  # the two ranks' replicated state is held once
        assert st["bytes_by_tier"][tier] == st["unique_logical_bytes"] == written > 0
        assert st["bytes_by_tier"]["device"] == 0
        with pytest.raises(WorkerError, match="offloaded"):
            a.run("forward", {"ids": BATCH})  # nothing runs unless its state is on the device
        a.run("load")
        assert a.run("sync_weights")["digest"] == ref
        assert a.run("forward", {"ids": BATCH})["logprobs"] == logprobs
    train(a, 1, seed=6)  # the optimizer's moments came back too: training goes on


def test_one_operation_at_a_time(pair) -> None:
    a, _, _ = pair
    errors: list[Exception] = []

    def gen() -> None:
        a.run("generate", {"ids": BATCH, "max_tokens": 256})

    t = threading.Thread(target=gen)
    t.start()
    while a.running is None and t.is_alive():
        pass
    try:
        a.run("sync_weights")
    except WorkerError as exc:
        errors.append(exc)
    t.join()
    assert errors and "one operation at a time" in str(errors[0])
    with pytest.raises(ConfigError, match="unknown operation"):
        a.run("train_harder")


def test_checkpoints_round_trip(pair, tmp_path: Path) -> None:
    a, _, _ = pair
    path = tmp_path / "ckpt.pt"
    saved = a.run("save_ckpt", {"path": str(path)})
    digest = a.run("sync_weights")["digest"]
    train(a, 1, seed=9)
    assert a.run("sync_weights")["digest"] != digest
    assert a.run("load_ckpt", {"path": str(path)})["step"] == saved["step"]
    assert a.run("sync_weights")["digest"] == digest


def test_rollout_shards_are_cut_by_the_sidecar_each_byte_once(pair, tmp_path: Path) -> None:
    """sync_weights with a TP degree: the sidecar cuts each rollout rank's shards from the
    managed weights; they are slices of the full tensors, and no split byte is fetched twice."""
    import hashlib

    from loom.runtime.cluster.model import TinyDecoder, TinyDecoderSpec, param_specs
    from loom.state.weights.shards import shard_box

    a, _, _ = pair
    out = a.run("sync_weights", {"tp": 2})["reshard"]
    a.run("save_ckpt", {"path": str(tmp_path / "w.pt")})
    full = {
        k.split("/", 1)[1]: v
        for k, v in torch.load(tmp_path / "w.pt").items()
        if k.startswith("weights/")
    }
    specs = param_specs(TinyDecoder(TinyDecoderSpec()))
    split = sum(full[p.name].numel() * 4 for p in specs if p.rule.dim is not None)
    replicated = sum(full[p.name].numel() * 4 for p in specs if p.rule.dim is None)
    assert sum(out["fetched_bytes"]) == split + 2 * replicated
    for r in range(2):
        h = hashlib.sha256()
        for p in sorted(specs, key=lambda p: p.name):
            box = shard_box(p, 2, r)
            piece = full[p.name][tuple(box.slices)].contiguous()
            h.update(p.name.encode())
            h.update(piece.view(-1).view(torch.uint8).numpy().tobytes())
        assert out["shard_digests"][r] == h.hexdigest()


def test_two_jobs_multiplexed_with_forced_switches_match_each_alone(tmp_path: Path) -> None:
    """Jobs A and B share a node: before each of the other's steps the resident job is
    offloaded and the next loaded. Their weights end bit-identical to running alone."""
    steps = 3
    alone = {}
    for name, seed in (("x", 11), ("y", 12)):
        with WorkerGroup(
            WorkerGroupConfig(name=f"alone-{name}", dp=2, seed=seed, state_dir=tmp_path / name)
        ) as g:
            train(g, steps, seed=seed)
            alone[name] = g.run("sync_weights")["digest"]

    def cfg(n: str, seed: int) -> WorkerGroupConfig:
        return WorkerGroupConfig(name=f"mux-{n}", dp=2, seed=seed, state_dir=tmp_path / f"m{n}")

    with WorkerGroup(cfg("x", 11)) as x, WorkerGroup(cfg("y", 12)) as y:
        y.run("offload", {"tier": "host"})
        for s in range(steps):
            for job, other, seed in ((x, y, 11), (y, x, 12)):
                other.run("offload", {"tier": "disk" if s % 2 else "host"})
                job.run("load")
                batch = [[(v * (seed + s + 1)) % 128 for v in row] for row in BATCH]
                job.run("forward_backward", {"ids": batch, "advantages": [1.0, -0.5, 0.25, 1.0]})
                job.run("optim_step")
        x.run("load")
        y.run("load")
        assert x.run("sync_weights")["digest"] == alone["x"]
        assert y.run("sync_weights")["digest"] == alone["y"]


def test_a_killed_worker_fails_the_operation_with_a_reason(tmp_path: Path) -> None:
    with WorkerGroup(WorkerGroupConfig(name="victim", dp=2, state_dir=tmp_path)) as g:
        os.kill(g.pids[1], signal.SIGKILL)
        g._procs[1].wait(10)
        with pytest.raises(GroupBroken, match=r"rank 1 \(pid \d+\) was killed by SIGKILL"):
            g.run("forward", {"ids": BATCH})
        assert not g.alive
