"""PlexRL's StateManager (§4.5) over real tiers (torch tensors; a CPU device tier here, disk
files): offload then load bit-identical, replicas stored once, no tier over capacity, eviction
by the scheduler's plan, nothing read unless on the device, checkpoints and resharding cut from
offloaded state, each rank fetching only its own slices, and migration to another node."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from loom.core.errors import ConfigError, NotFound  # noqa: E402
from loom.state.manager import NotResident, StateKey, StateManager  # noqa: E402
from loom.state.tiers import DiskTier, Tier, TierFull  # noqa: E402
from loom.state.weights.params import ParamSpec, ShardRule  # noqa: E402

MB = 1 << 20


def manager(
    tmp: Path, *, gpus: int = 2, device: int = 64 * MB, host: int = 64 * MB, disk: int = 256 * MB
) -> StateManager:
    return StateManager(
        gpus=gpus,
        device_bytes=device,
        host_bytes=host,
        disk_bytes=disk,
        disk_dir=tmp / "disk",
        device="cpu",
        pin_host=False,
        verify_replicas=True,
    )


def model_state(model: str, seed: int, n: int = 3, size: int = 256) -> dict[StateKey, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(n):
        out[StateKey(model, "weights", f"w{i}")] = torch.randn(size, size, generator=g).to(
            torch.bfloat16
        )
        out[StateKey(model, "optimizer", f"m{i}")] = torch.randn(size, size, generator=g)
    return out


def register_dp(
    sm: StateManager, dep: str, state: dict[StateKey, torch.Tensor], dp: int = 2
) -> None:
    """A data-parallel deployment: every rank holds the same keys, on its own GPU."""
    for rank in range(dp):
        sm.register(dep, rank, rank, {k: v.clone() for k, v in state.items()})


def test_offload_then_load_is_bit_identical_and_replicas_are_stored_once(tmp_path: Path) -> None:
    sm = manager(tmp_path)
    state = model_state("a", 1)
    register_dp(sm, "job-a", state)
    unique = sum(t.numel() * t.element_size() for t in state.values())
    assert sm.offload("job-a") == unique  # one copy of each key, whatever the DP degree
    st_ = sm.stats()
    assert st_.bytes_by_tier == {"device": 0, "host": unique, "disk": 0}
    assert st_.unique_logical_bytes == unique
    with pytest.raises(NotResident):
        sm.tensors("job-a", 0)  # nothing runs unless its state is on the device
    sm.load("job-a")
    for rank in (0, 1):
        got = sm.tensors("job-a", rank)
        assert set(got) == set(state)
        for k, v in state.items():
            assert torch.equal(got[k], v) and got[k].dtype == v.dtype
    assert sm.stats().bytes_by_tier["host"] == 0  # a key lives in one place at a time


def test_offloading_diverged_replicas_is_an_error(tmp_path: Path) -> None:
    sm = manager(tmp_path)
    state = model_state("a", 1)
    sm.register("job-a", 0, 0, state)
    sm.register("job-a", 1, 1, {k: v + 1 for k, v in state.items()})
    with pytest.raises(AssertionError, match="replicas"):
        sm.offload("job-a")


def test_host_spills_to_disk_by_the_plan_and_prefetch_brings_it_back(tmp_path: Path) -> None:
    one = sum(t.numel() * t.element_size() for t in model_state("x", 0).values())
    sm = manager(tmp_path, gpus=1, device=one + MB, host=one + MB)
    states = {name: model_state(name, i) for i, name in enumerate("abc")}
    for name, state in states.items():
        sm.register(f"job-{name}", 0, 0, state)  # each load pushes the last one off the GPU
        assert sm.stats().bytes_by_tier["device"] <= one + MB
    # the scheduler will run b next, then a: c is used furthest, so its state goes to disk
    sm.set_plan(["job-b", "job-a"])
    sm.offload("job-c")
    assert sm.stats().bytes_by_tier["host"] <= one + MB  # never over capacity
    homes = {k.model: t for k, t in sm._home.items()}
    assert homes["b"] == Tier.HOST and homes["c"] == Tier.DISK  # b is next: it stays warm
    sm.set_plan(["job-a"])
    sm.prefetch("job-a")
    assert all(t == Tier.HOST for k, t in sm._home.items() if k.model == "a")
    sm.load("job-a")
    for k, v in states["a"].items():
        assert torch.equal(sm.tensors("job-a", 0)[k], v)
    st_ = sm.stats()
    assert st_.moved_bytes.get("host->disk", 0) > 0 and st_.moved_bytes.get("disk->host", 0) > 0


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.sampled_from("abcd"), st.sampled_from(["load", "offload_host", "offload_disk"])
        ),
        max_size=25,
    )
)
def test_no_tier_ever_exceeds_its_capacity_and_nothing_is_lost(tmp_path: Path, ops) -> None:
    one = sum(t.numel() * t.element_size() for t in model_state("x", 0, n=2, size=64).values())
    sm = manager(
        tmp_path / str(abs(hash(tuple(ops)))), gpus=1, device=2 * one, host=2 * one, disk=8 * one
    )
    states = {n: model_state(n, i, n=2, size=64) for i, n in enumerate("abcd")}
    for n, s in states.items():
        sm.register(f"job-{n}", 0, 0, s)
    for t, (n, op) in enumerate(ops):
        dep = f"job-{n}"
        sm.use(dep, t)
        if op == "load":
            sm.load(dep)
        else:
            sm.offload(dep, Tier.HOST if op == "offload_host" else Tier.DISK)
        assert all(d.used <= d.capacity for d in sm.devices)
        assert sm.host.used <= sm.host.capacity and sm.disk.used <= sm.disk.capacity
    for n, s in states.items():
        sm.load(f"job-{n}")
        for k, v in s.items():
            assert torch.equal(sm.tensors(f"job-{n}", 0)[k], v), f"{n}/{k} changed"


def test_a_tensor_larger_than_a_tier_is_refused_with_its_size(tmp_path: Path) -> None:
    sm = manager(tmp_path, gpus=1, device=MB)
    with pytest.raises(TierFull, match="device tier"):
        sm.register(
            "big", 0, 0, {StateKey("m", "weights", "w"): torch.zeros(2 * MB, dtype=torch.uint8)}
        )
    with pytest.raises(ConfigError, match="no GPU 3"):
        sm.register("x", 0, 3, {})


def test_checkpoint_and_resharding_cut_from_offloaded_tp_shards(tmp_path: Path) -> None:
    """Training holds each weight split over TP 2 (two pieces); offloaded, the StateManager
    writes the whole tensors and cuts TP-4 rollout shards, each rank fetching only its own."""
    sm = manager(tmp_path)
    g = torch.Generator().manual_seed(0)
    full = {
        "model.layers.0.mlp.gate_proj.weight": torch.randn(8, 6, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.down_proj.weight": torch.randn(6, 8, generator=g).to(torch.bfloat16),
        "model.norm.weight": torch.randn(6, generator=g).to(torch.bfloat16),
    }
    rules = {
        "gate_proj": ShardRule.COLUMN,
        "down_proj": ShardRule.ROW,
        "norm": ShardRule.REPLICATED,
    }
    params = [
        ParamSpec(name=n, shape=tuple(t.shape), rule=next(r for m, r in rules.items() if m in n))
        for n, t in full.items()
    ]
    for rank in range(2):
        mine = {}
        for p in params:
            dim = p.rule.dim
            if dim is None:
                mine[StateKey("m", "weights", p.name)] = full[p.name].clone()
                continue
            step = p.shape[dim] // 2
            box = tuple(
                (rank * step, (rank + 1) * step) if d == dim else (0, s)
                for d, s in enumerate(p.shape)
            )
            mine[StateKey("m", "weights", p.name, box)] = full[p.name][
                tuple(slice(a, b) for a, b in box)
            ].clone()
        sm.register("train", rank, rank, mine)
    sm.offload("train", Tier.DISK)
    names = sm.checkpoint("m", tmp_path / "ckpt.pt")
    saved = torch.load(tmp_path / "ckpt.pt")
    assert sorted(names) == sorted(f"weights/{n}" for n in full)
    for n, t in full.items():
        assert torch.equal(saved[f"weights/{n}"], t)
    total = 0
    for r in range(4):
        shards, fetched = sm.materialize("m", "weights", params, tp=4, rank=r)
        total += fetched
        for p in params:
            dim = p.rule.dim
            want = full[p.name] if dim is None else full[p.name].chunk(4, dim=dim)[r]
            assert torch.equal(shards[p.name], want)
    split = sum(full[p.name].numel() * 2 for p in params if p.rule.dim is not None)
    replicated = sum(full[p.name].numel() * 2 for p in params if p.rule.dim is None)
    assert total == split + 4 * replicated  # no split byte fetched twice


def test_migration_mirrors_offloaded_state_to_another_node(tmp_path: Path) -> None:
    a, b = manager(tmp_path / "a"), manager(tmp_path / "b")
    state = model_state("a", 3)
    register_dp(a, "job", state)
    a.offload("job")
    c = manager(tmp_path / "c")
    c.register("running", 0, 0, model_state("r", 4))
    with pytest.raises(ConfigError, match="offload"):
        c.mirror_to(b, "running")  # its state is on the GPU, in use
    with pytest.raises(NotFound, match="unknown deployment"):  # a 404 where a service answers
        a.mirror_to(b, "nope")
    copied = a.mirror_to(b, "job")
    assert copied == sum(t.numel() * t.element_size() for t in state.values())
    b.load("job")
    for rank in (0, 1):
        for k, v in state.items():
            assert torch.equal(b.tensors("job", rank)[k], v)


def test_the_disk_tier_says_whether_it_wrote_directly(tmp_path: Path) -> None:
    disk = DiskTier(16 * MB, tmp_path / "d")
    t = torch.arange(10_000, dtype=torch.float32)
    disk.put("k", t)
    assert disk.direct_io in (True, False)
    assert torch.equal(disk.get("k"), t)
    assert (tmp_path / "d").stat().st_size >= 0 and disk.used == t.numel() * 4
    disk.delete("k")
    assert disk.used == 0 and not list((tmp_path / "d").iterdir())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_state_goes_through_pinned_host_memory_bit_for_bit(tmp_path: Path) -> None:
    sm = StateManager(
        gpus=2, device_bytes=256 * MB, host_bytes=256 * MB, disk_bytes=512 * MB, disk_dir=tmp_path
    )
    assert sm.host.pinned and sm.devices[0].device.type == "cuda"
    state = model_state("g", 7, n=4, size=1024)
    register_dp(sm, "job", state)
    for tier in (Tier.HOST, Tier.DISK, Tier.HOST):
        sm.offload("job", tier)
        assert sm.stats().bytes_by_tier["device"] == 0
        sm.load("job")
        for rank in (0, 1):
            got = sm.tensors("job", rank)
            assert all(got[k].is_cuda and torch.equal(got[k].cpu(), v) for k, v in state.items())
    raw = next(iter(sm.host._pool.values()))[0]
    assert raw.is_pinned()  # freed pinned buffers are kept for the next offload


def test_a_refused_move_leaves_the_deployment_as_it_was(tmp_path: Path) -> None:
    """An offload with nowhere to go, a bind past the GPU, an adoption past host and disk: each
    is refused, and the deployment's state reads as before (no stale copies, no lost keys)."""
    state = model_state("a", 9)
    size = sum(t.numel() * t.element_size() for t in state.values())
    sm = StateManager(
        gpus=1,
        device_bytes=size + 1024,
        host_bytes=size // 3,
        disk_bytes=size // 3,
        disk_dir=tmp_path / "d",
        device="cpu",
        pin_host=False,
        external_device=True,
    )
    sm.register("a", 0, 0, state)
    with pytest.raises(TierFull):
        sm.offload("a", Tier.HOST)  # host and disk together hold two thirds of it
    assert sm.stats().bytes_by_tier == {"device": size, "host": 0, "disk": 0}
    assert sm.deployments()["a"]["loaded"]
    bigger = {**state, StateKey("a", "optimizer", "extra"): torch.zeros(4096)}
    with pytest.raises(TierFull, match=r"offload first|resident"):
        sm.bind("a", 0, 0, bigger)
    for k, v in state.items():
        assert torch.equal(sm.tensors("a", 0)[k], v)
        assert torch.equal(sm.full_tensor("a", k.kind, k.name), v)
    other = StateManager(
        gpus=1,
        device_bytes=size,
        host_bytes=size // 3,
        disk_bytes=size // 3,
        disk_dir=tmp_path / "o",
        device="cpu",
        pin_host=False,
    )
    with pytest.raises(TierFull):
        other.adopt("a", {0: 0}, {0: list(state)}, state)
    assert other.stats().bytes_by_tier == {"device": 0, "host": 0, "disk": 0}
