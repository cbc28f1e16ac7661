"""Offload and load throughput of the StateManager (PlexRL §4.5): a data-parallel deployment's
state (bf16 weights and fp32 optimizer) off its devices to host, back, and through disk.

    python benchmarks/bench_state_manager.py [--mb 512] [--dp 2] [--repeats 3] [--via sidecar]

`--via sidecar` runs the StateManager as the node's sidecar process (§5.3) and this process as
the deployment's ranks (one thread and connection each): the ranks export their memory (CUDA
IPC on a GPU, shared memory on the CPU) and the sidecar does the copies.

On a machine with CUDA the device tier is the GPU and host memory is pinned, so the figures
compare with `bench_host_device_copy.py`'s pinned bandwidth (the issue's target: >= 80% of
it); without CUDA the device tier is CPU memory and the figures are memory-copy and disk rates.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from loom.state.manager import StateKey, StateManager
from loom.state.sidecar import SidecarConfig, StateSidecar
from loom.state.tiers import Tier

ROWS = ("offload->host", "load<-host", "offload->disk", "load<-disk")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mb", type=int, default=512, help="unique state bytes (MiB)")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--via", choices=("process", "sidecar"), default="process")
    args = ap.parse_args()
    n = args.mb * 2**20
    cuda = torch.cuda.is_available()
    tensors = {}
    per = 64 * 2**20  # 64 MiB tensors, half bf16 weights, half fp32 optimizer
    for i in range(max(1, n // per)):
        kind, dtype = ("weights", torch.bfloat16) if i % 2 == 0 else ("optimizer", torch.float32)
        numel = per // torch.tensor([], dtype=dtype).element_size()
        tensors[StateKey("m", kind, f"t{i}")] = torch.rand(numel).to(dtype)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if args.via == "sidecar":
        sidecar(tensors, total, args.dp, args.repeats, cuda)
        return
    with tempfile.TemporaryDirectory() as tmp:
        sm = StateManager(
            gpus=args.dp,
            device_bytes=2 * total,
            host_bytes=2 * total,
            disk_bytes=4 * total,
            disk_dir=Path(tmp),
        )
        for rank in range(args.dp):
            sm.register("job", rank, rank, tensors)
        rows: dict[str, list[float]] = {k: [] for k in ROWS}
        for _ in range(args.repeats):
            for tier, name in ((Tier.HOST, "host"), (Tier.DISK, "disk")):
                t0 = time.perf_counter()
                sm.offload("job", tier)
                if cuda:
                    torch.cuda.synchronize()
                rows[f"offload->{name}"].append(total / (time.perf_counter() - t0) / 1e9)
                t0 = time.perf_counter()
                sm.load("job")
                if cuda:
                    torch.cuda.synchronize()
                rows[f"load<-{name}"].append(args.dp * total / (time.perf_counter() - t0) / 1e9)
        host = "pinned" if sm.host.pinned else "pageable"
        where = (
            f"device {'cuda' if cuda else 'cpu'}, host {host}, disk direct_io={sm.disk.direct_io}"
        )
        report(rows, total, args.dp, where)


def report(rows: dict[str, list[float]], total: int, dp: int, where: str) -> None:
    print(f"{total / 2**20:.0f} MiB unique state, DP {dp} ({where})")
    for name, vals in rows.items():
        print(f"  {name:14s} {statistics.median(vals):6.2f} GB/s (median of {len(vals)})")


def sidecar(
    tensors: dict[StateKey, torch.Tensor], total: int, dp: int, repeats: int, cuda: bool
) -> None:
    """The same moves through a sidecar process, the ranks as threads of this one."""
    device = "cuda" if cuda else "cpu"
    held = [{k: v.to(device) for k, v in tensors.items()} for _ in range(dp)]
    rows: dict[str, list[float]] = {k: [] for k in ROWS}
    with (
        tempfile.TemporaryDirectory() as tmp,
        StateSidecar(
            SidecarConfig(
                gpus=dp,
                device_bytes=2 * total,
                host_bytes=2 * total,
                disk_bytes=4 * total,
                disk_dir=tmp,
            )
        ) as sc,
    ):
        clients = [sc.client() for _ in range(dp)]

        def each(fn) -> list:  # type: ignore[no-untyped-def, type-arg]
            with ThreadPoolExecutor(dp) as pool:
                return list(pool.map(fn, range(dp)))

        for _ in range(repeats):
            for tier in ("host", "disk"):
                t0 = time.perf_counter()
                each(lambda r, h=held, t=tier: clients[r].offload("job", r, dp, r, h[r], tier=t))
                rows[f"offload->{tier}"].append(total / (time.perf_counter() - t0) / 1e9)
                held = [{} for _ in range(dp)]
                t0 = time.perf_counter()
                got = each(lambda r: clients[r].load("job", r, dp, device=device))
                rows[f"load<-{tier}"].append(dp * total / (time.perf_counter() - t0) / 1e9)
                held = [g.views for g in got]
        with sc.client() as c:
            st = c.call("stats")
        for cl in clients:
            cl.close()
    host = "pinned" if st["pinned_host"] else "pageable"
    report(
        rows,
        total,
        dp,
        f"via a sidecar, device {device}, host {host}, disk direct_io={st['direct_io']}",
    )


if __name__ == "__main__":
    main()
