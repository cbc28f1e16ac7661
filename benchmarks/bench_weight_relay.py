"""Loopback throughput of the weight relay (ROSE §4.2: 64 MB buckets pushed, ≥1 GB batches
pulled).

Starts `loom serve relay` as its own process, then per repeat: a `Pusher` with 2 threads
pushes N buckets of 64 MB (one stream of 64 MB blobs, so each bucket is one copy of its
blob), then the same bytes are pulled twice by one client in 1 GB batches: as raw
`get_many` batches, and through a `Puller` (which also cuts the batches back into blobs).
Reports MB/s (median over repeats; MB = 10^6 bytes) and the relay's CPU seconds per phase
(from /proc), so the cost per byte on the relay's side is visible apart from the client's.

Run: python benchmarks/bench_weight_relay.py [--quick] [--buckets 32] [--bucket-mb 64]
       [--batch-mb 1024] [--repeats 3] [--json PATH]

`--json PATH` writes one results document (`loom.bench.results`): a record `"phase"` per phase
(push, pull get_many, pull Puller) with its medians and each repeat's figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from loom.bench.script import add_json_option, write_json
from loom.client import RelayClient
from loom.runtime.relay import Puller, Pusher
from loom.runtime.relay.process import RelayProcess

MiB = 1 << 20


def _timed(proc: RelayProcess, fn: Callable[[], object]) -> tuple[float, float]:
    """Wall seconds of `fn()` and the relay's CPU seconds meanwhile."""
    cpu0, t0 = proc.cpu_seconds(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, proc.cpu_seconds() - cpu0


def _repeat(
    proc: RelayProcess, relay: RelayClient, args: argparse.Namespace, version: int, blob: bytes
) -> dict[str, tuple[float, float]]:
    blobs = [(f"param{i}", blob) for i in range(args.buckets)]
    pusher = Pusher(relay, bucket_bytes=args.bucket_mb * MiB, workers=2)
    puller = Puller(relay, batch_bytes=args.batch_mb * MiB)
    out = {"push": _timed(proc, lambda: pusher.push(version, "dense", blobs))}
    manifest = puller.manifest(version, "dense")

    def raw() -> None:
        pulled = sum(
            len(data)
            for batch in puller.batches(manifest)
            for data in relay.get_many(batch).values()
        )
        assert pulled == manifest.size

    def blobs_back() -> None:
        for _name, data in puller.iter_pull(manifest):
            assert len(data) == len(blob)

    out["pull get_many"] = _timed(proc, raw)
    out["pull Puller"] = _timed(proc, blobs_back)
    for info in relay.list(version=version):
        relay.delete(info.key)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 buckets (256 MB), 3 repeats")
    ap.add_argument("--buckets", type=int, default=32, help="buckets pushed per repeat")
    ap.add_argument("--bucket-mb", type=int, default=64, help="bucket size, MiB")
    ap.add_argument("--batch-mb", type=int, default=1024, help="pull batch size, MiB")
    ap.add_argument("--repeats", type=int, default=3)
    add_json_option(ap)
    args = ap.parse_args()
    if args.quick:
        args.buckets = 4
    total = args.buckets * args.bucket_mb * MiB
    cap = f"{total // MiB + 256}M"
    blob = os.urandom(args.bucket_mb * MiB)
    rows: dict[str, list[tuple[float, float]]] = {}
    with (
        RelayProcess.start(
            "--max-bytes", cap, "--max-object-bytes", f"{args.bucket_mb + 1}M"
        ) as proc,
        RelayClient(proc.url, timeout_s=120.0, trust_env=False) as relay,
    ):
        for r in range(args.repeats):
            for phase, result in _repeat(proc, relay, args, r + 1, blob).items():
                rows.setdefault(phase, []).append(result)
    print(
        f"weight relay on loopback: {args.buckets} x {args.bucket_mb} MiB buckets "
        f"({total / 1e6:.0f} MB) per repeat, 2 push threads, {args.batch_mb} MiB pull batches, "
        f"median of {args.repeats}; {os.cpu_count()} cores shared by client and relay"
    )
    print(f"  {'phase':<14} {'MB/s':>8} {'wall s':>8} {'relay CPU s':>12} {'relay CPU s/GB':>15}")
    records = []
    for phase, results in rows.items():
        wall = statistics.median(w for w, _ in results)
        cpu = statistics.median(c for _, c in results)
        print(
            f"  {phase:<14} {total / 1e6 / wall:8.0f} {wall:8.3f} {cpu:12.2f} "
            f"{cpu / (total / 1e9):15.2f}"
        )
        records.append(
            {
                "record": "phase",
                "phase": phase,
                "buckets": args.buckets,
                "bucket_mib": args.bucket_mb,
                "batch_mib": args.batch_mb,
                "push_threads": 2,
                "repeats": args.repeats,
                "mb": total / 1e6,
                "mb_s": total / 1e6 / wall,
                "wall_s": wall,
                "relay_cpu_s": cpu,
                "relay_cpu_s_per_gb": cpu / (total / 1e9),
                "wall_runs_s": [w for w, _ in results],
                "relay_cpu_runs_s": [c for _, c in results],
            }
        )
    if out := write_json(args.json, "bench_weight_relay", records, seed=0):
        print(f"wrote {len(records)} records to {out}")


if __name__ == "__main__":
    main()
