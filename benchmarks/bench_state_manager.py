"""Offload and load throughput of the StateManager (PlexRL §4.5): a data-parallel deployment's
state (bf16 weights and fp32 optimizer) off its devices to host, back, and through disk.

    python benchmarks/bench_state_manager.py [--mb 512] [--dp 2] [--repeats 3]

On a machine with CUDA the device tier is the GPU and host memory is pinned, so the figures
compare with `bench_host_device_copy.py`'s pinned bandwidth (the issue's target: >= 80% of
it); without CUDA the device tier is CPU memory and the figures are memory-copy and disk rates.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from loom.state.manager import StateKey, StateManager
from loom.state.tiers import Tier


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mb", type=int, default=512, help="unique state bytes (MiB)")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
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
        rows: dict[str, list[float]] = {
            k: [] for k in ("offload->host", "load<-host", "offload->disk", "load<-disk")
        }
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
        print(f"{total / 2**20:.0f} MiB unique state, DP {args.dp} ({where})")
        for name, vals in rows.items():
            print(f"  {name:14s} {statistics.median(vals):6.2f} GB/s (median of {len(vals)})")


if __name__ == "__main__":
    main()
