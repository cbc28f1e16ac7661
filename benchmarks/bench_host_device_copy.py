"""Host <-> device copy bandwidth, the rate a state offload or load runs at (PlexRL §4.5, §5.3:
pinned host memory; the colocated baselines offload through pageable memory).

    python benchmarks/bench_host_device_copy.py [--sizes-mb 256,1024,4096] [--json PATH]

Per size and direction (host-to-device, device-to-host) and host memory kind (pinned,
pageable): the median GB/s of `repeats` copies after one warm-up, timed with CUDA events. On a
machine without CUDA it says so and exits 0, writing nothing.

`--json PATH` writes one results document (`loom.bench.results`): a record `"copy"` per size,
host memory kind and direction.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from loom.bench.script import add_json_option, write_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes-mb", default="256,1024,4096")
    ap.add_argument("--repeats", type=int, default=5)
    add_json_option(ap)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    rows = []
    for mb in (int(x) for x in args.sizes_mb.split(",")):
        n = mb * 2**20
        gpu = torch.empty(n, dtype=torch.uint8, device=dev)
        for kind in ("pinned", "pageable"):
            host = torch.empty(n, dtype=torch.uint8, pin_memory=(kind == "pinned"))
            host.fill_(1)
            for direction in ("h2d", "d2h"):
                times = []
                for i in range(args.repeats + 1):
                    start, end = (
                        torch.cuda.Event(enable_timing=True),
                        torch.cuda.Event(enable_timing=True),
                    )
                    torch.cuda.synchronize()
                    start.record()
                    if direction == "h2d":
                        gpu.copy_(host, non_blocking=(kind == "pinned"))
                    else:
                        host.copy_(gpu, non_blocking=(kind == "pinned"))
                    end.record()
                    torch.cuda.synchronize()
                    if i:
                        times.append(start.elapsed_time(end) / 1e3)
                gbs = n / statistics.median(times) / 1e9
                rows.append(
                    {
                        "record": "copy",
                        "device": name,
                        "size_mib": mb,
                        "host": kind,
                        "direction": direction,
                        "repeats": args.repeats,
                        "gb_s": gbs,
                        "gb_s_runs": [n / t / 1e9 for t in times],
                    }
                )
                print(f"{name}: {mb:>5} MB {kind:>8} {direction}: {gbs:6.1f} GB/s")
            del host
        del gpu
    if out := write_json(args.json, "bench_host_device_copy", rows, seed=0):
        print(f"wrote {len(rows)} records to {out}")


if __name__ == "__main__":
    sys.exit(main())
