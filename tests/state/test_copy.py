"""Chunked, pipelined state copies (`loom.state.copy`): chunks cover every byte once; a copy
lands bit for bit whatever the chunk size, dtype, size or layout; through the StateManager and
the sidecar, offloads and loads cut into many chunks come back bit-identical. On a GPU: device
to pinned and to pageable host (staging) and back, many copies in flight before one wait,
ordered after work already queued on the current stream."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from loom.core.errors import ConfigError  # noqa: E402
from loom.state.copy import Copier, chunk_spans  # noqa: E402
from loom.state.manager import StateKey, StateManager  # noqa: E402
from loom.state.sidecar import SidecarConfig, StateSidecar  # noqa: E402
from loom.state.tiers import Tier  # noqa: E402

pytestmark = [pytest.mark.torch]

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
cuda = [pytest.mark.gpu, needs_cuda]


@given(st.integers(0, 10_000), st.integers(0, 3_000))
def test_chunk_spans_cover_every_byte_once_in_order(n: int, chunk: int) -> None:
    spans = chunk_spans(n, chunk)
    assert [b for lo, hi in spans for b in range(lo, hi)] == list(range(n))
    if chunk:
        assert all(0 < hi - lo <= chunk for lo, hi in spans)
        assert len(spans) == -(-n // chunk)
    else:
        assert len(spans) == (1 if n else 0)


def test_negative_sizes_are_refused() -> None:
    with pytest.raises(ConfigError):
        chunk_spans(-1, 4)
    with pytest.raises(ConfigError, match="streams"):
        Copier(chunk_bytes=-1)
    with pytest.raises(ConfigError):
        StateManager(
            gpus=1, device_bytes=1, host_bytes=1, disk_bytes=1, disk_dir=Path("/nonexistent"),
            device="cpu", copy_streams=-2,
        )  # fmt: skip
    with pytest.raises(ConfigError, match="copy_chunk_bytes"):
        SidecarConfig(copy_chunk_bytes=-5)


def tensors(g: torch.Generator) -> list[torch.Tensor]:
    """Odd sizes (not multiples of any chunk), several dtypes, empty and 0-d, non-contiguous."""
    return [
        torch.randn(1001, generator=g),
        torch.randn(37, 29, generator=g).to(torch.bfloat16),
        torch.randint(-100, 100, (333,), generator=g, dtype=torch.int8),
        torch.rand(77, generator=g) > 0.5,
        torch.randn(0, 5, generator=g),
        torch.tensor(3.25),
        torch.randn(40, 30, generator=g).t(),  # non-contiguous
    ]


def poisoned(t: torch.Tensor, device: str = "cpu", pin: bool = False) -> torch.Tensor:
    out = torch.empty(t.shape, dtype=t.dtype, device=device, pin_memory=pin)
    out.view(-1).view(torch.uint8).fill_(0xA5)
    return out


@pytest.mark.parametrize("chunk", [1, 7, 1000, 1 << 20, 0])
def test_cpu_copies_land_bit_for_bit_in_chunks(chunk: int) -> None:
    copier = Copier(chunk_bytes=chunk, streams=2)
    srcs = tensors(torch.Generator().manual_seed(chunk))
    dsts = [poisoned(s) for s in srcs]
    for d, s in zip(dsts, srcs, strict=True):
        copier.copy(d, s)
        assert not copier.pending  # between CPU tensors a copy is done on return
    copier.sync()
    for d, s in zip(dsts, srcs, strict=True):
        assert torch.equal(d, s)
    c = copier.counters
    moved = [s for s in srcs if s.numel()]
    assert c.copies == len(moved)
    assert c.bytes == sum(s.numel() * s.element_size() for s in moved)
    if chunk:  # contiguous tensors are cut; the non-contiguous one goes whole
        want = sum(
            len(chunk_spans(s.numel() * s.element_size(), chunk)) if s.is_contiguous() else 1
            for s in moved
        )
        assert c.chunks == want
    with pytest.raises(ConfigError, match="same shape and dtype"):
        copier.copy(torch.empty(3), torch.empty(4))
    with pytest.raises(ConfigError, match="same shape and dtype"):
        copier.copy(torch.empty(4, dtype=torch.float64), torch.empty(4))


def state(seed: int, n: int = 4) -> dict[StateKey, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(n):
        out[StateKey("m", "weights", f"w{i}")] = torch.randn(61, 33, generator=g).to(torch.bfloat16)
        out[StateKey("m", "optimizer", f"o{i}")] = torch.randn(61, 33, generator=g)
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_the_state_manager_moves_state_in_many_chunks_bit_for_bit(
    tmp_path: Path, device: str
) -> None:
    s = state(1)
    size = sum(t.numel() * t.element_size() for t in s.values())
    sm = StateManager(
        gpus=2, device_bytes=4 * size, host_bytes=4 * size, disk_bytes=8 * size,
        disk_dir=tmp_path, device=device, copy_chunk_bytes=1000, copy_streams=3,
        verify_replicas=True,
    )  # fmt: skip
    for rank in (0, 1):
        sm.register("j", rank, rank, s)
    for tier in (Tier.HOST, Tier.DISK, Tier.HOST):
        assert sm.offload("j", tier) == size
        assert not sm.copier.pending  # a returned move has no copy in flight
        assert sm.load("j") == 2 * size
        assert not sm.copier.pending
        for rank in (0, 1):
            got = sm.tensors("j", rank)
            assert all(got[k].device.type == device and torch.equal(got[k].cpu(), v)
                       for k, v in s.items())  # fmt: skip
    c = sm.copier.counters
    assert c.chunks > 4 * c.copies  # each 6 kB tensor went as several chunks


def held_state(seed: int, device: str) -> dict[StateKey, torch.Tensor]:
    return {k: v.to(device) for k, v in state(seed).items()}


@pytest.mark.parametrize(
    ("device", "pin"),
    [
        ("cpu", None),
        pytest.param("cuda", True, marks=cuda),  # device <-> pinned host, chunks on 3 streams
        pytest.param("cuda", False, marks=cuda),  # pageable host: through pinned staging
    ],
)
def test_a_sidecar_offloads_and_loads_in_many_chunks_bit_for_bit(
    tmp_path: Path, device: str, pin: bool | None
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    s = held_state(2, device)
    size = sum(t.numel() * t.element_size() for t in s.values())
    cfg = SidecarConfig(
        gpus=2, host_bytes=4 * size, disk_bytes=8 * size, disk_dir=str(tmp_path),
        pin_host=pin, copy_chunk_bytes=1000, copy_streams=3,
    )  # fmt: skip
    with StateSidecar(cfg) as sc, ThreadPoolExecutor(2) as pool:
        clients = [sc.client(timeout_s=60) for _ in range(2)]
        held = [{k: v.clone() for k, v in s.items()} for _ in range(2)]
        for tier in ("host", "disk", "host"):
            written = list(
                pool.map(
                    lambda r, t=tier, h=held: clients[r].offload("j", r, 2, r, h[r], tier=t), (0, 1)
                )
            )
            assert sorted(written) == [0, size]
            held = [{}, {}]
            got = list(pool.map(lambda r: clients[r].load("j", r, 2, device=device), (0, 1)))
            for g in got:
                assert g.bytes in (0, 2 * size)
                assert all(g.views[k].device.type == device and torch.equal(g.views[k], v)
                           for k, v in s.items())  # fmt: skip
            held = [g.views for g in got]
        with sc.client() as c:
            st = c.call("stats")
        for cl in clients:
            cl.close()
    copies = st["copy"]
    assert copies["chunks"] > 4 * copies["copies"]  # cut into chunks, in the sidecar
    if pin is False:
        assert not st["pinned_host"] and copies["staged_chunks"] > 0
    elif device == "cuda":  # through pinned host memory; staged only from disk (pageable)
        per_rank = sum(len(chunk_spans(t.numel() * t.element_size(), 1000)) for t in s.values())
        assert st["pinned_host"] and copies["staged_chunks"] == 2 * per_rank
    t = st["timings"]
    assert t["offload"]["calls"] == 3 and t["load"]["calls"] == 3
    assert all(row["map_s"] <= row["total_s"] for row in t.values())


# ---- on a GPU only ----------------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("pin", [True, False])
def test_many_device_host_copies_in_flight_land_bit_for_bit(pin: bool) -> None:
    """More chunks than staging buffers before one wait: device -> host, then host -> device
    into poisoned buffers; non-contiguous and device-to-device copies among them."""
    g = torch.Generator().manual_seed(int(pin))
    copier = Copier(chunk_bytes=1 << 16, streams=3)
    srcs = [torch.randn(n, generator=g) for n in (300_001, 65_536, 17, 1 << 20)]
    srcs.append(torch.randn(257, 129, generator=g).to(torch.bfloat16))
    on_gpu = [s.cuda() for s in srcs]
    on_gpu.append(torch.randn(300, 200, device="cuda").t())  # non-contiguous
    host = [poisoned(s, pin=pin) for s in on_gpu]
    for h, d in zip(host, on_gpu, strict=True):
        copier.copy(h, d)
    assert copier.pending
    copier.sync()
    assert not copier.pending
    for h, d in zip(host, on_gpu, strict=True):
        assert torch.equal(h, d.cpu())
    back = [poisoned(d, device="cuda") for d in on_gpu]
    twin = [poisoned(d, device="cuda") for d in on_gpu]
    for b, t, h, d in zip(back, twin, host, on_gpu, strict=True):
        copier.copy(b, h)
        copier.copy(t, d)  # device to device
    copier.sync()
    for b, t, d in zip(back, twin, on_gpu, strict=True):
        assert torch.equal(b, d) and torch.equal(t, d)
    if not pin:
        assert copier.counters.staged_chunks > 2 * 3  # the staging ring went round


@pytest.mark.gpu
@needs_cuda
def test_a_copy_waits_for_work_queued_before_it_on_the_current_stream() -> None:
    copier = Copier(chunk_bytes=1 << 20, streams=2)
    src = torch.zeros(8 << 20, device="cuda")
    dst = torch.empty(src.shape, pin_memory=True)
    torch.cuda._sleep(200_000_000)  # the current stream is busy for a while (~0.1 s) ...
    src.fill_(3.0)  # ... before it writes what the copy must see
    copier.copy(dst, src)
    copier.sync()
    assert bool((dst == 3.0).all())


def test_the_sidecars_mapper_holds_no_mapping_and_lets_go_of_the_old_one_when_remapped() -> None:
    """Each export maps on first use; what the mapper was asked to hold goes once the new
    mapping is made; mappings nobody uses are made (and let go) by `finish`."""
    import weakref

    from loom.state.sidecar.shm import Mapper, export_tensors

    s = state(3, n=2)
    exports, cleanup = export_tensors(s)
    try:
        mapper = Mapper()
        old = torch.zeros(1)
        gone = weakref.ref(old)
        views = {e.key: mapper(e, hold=old if i == 0 else None) for i, e in enumerate(exports)}
        del old
        first, *rest = views.values()
        assert gone() is not None and not first.resolved  # held until the new mapping is made
        assert torch.equal(first.resolve(), s[next(iter(views))])
        assert gone() is None
        made = weakref.ref(first.resolve())
        del first, views
        assert made() is None  # the mapper kept nothing of it
        mapper.finish()
        assert all(d.resolved for d in rest)
    finally:
        cleanup()


@pytest.mark.gpu
@needs_cuda
def test_a_copy_lets_go_of_its_tensors_once_done() -> None:
    import weakref

    copier = Copier(chunk_bytes=1 << 20, streams=2)
    src = torch.randn(3 << 20, device="cuda")
    want = src.cpu()
    dst = torch.empty(src.shape, pin_memory=True)
    gone = weakref.ref(src)
    copier.copy(dst, src)
    del src
    assert gone() is not None  # in flight: the copier holds it
    copier.sync()
    assert gone() is None and torch.equal(dst, want)
