"""Offload and load throughput of the StateManager (PlexRL §4.5): a data-parallel deployment's
state (bf16 weights and fp32 optimizer) off its devices to host, back, and through disk.

    python benchmarks/bench_state_manager.py [--mb 512] [--dp 2] [--repeats 3] [--via sidecar]
        [--tiers host,disk] [--chunk-mb 32] [--streams 2] [--json PATH]

`--via sidecar` runs the StateManager as the node's sidecar process (§5.3) and this process as
the deployment's ranks (one thread and connection each): the ranks export their memory (CUDA
IPC on a GPU, shared memory on the CPU) and the sidecar does the copies; it also prints where
the sidecar's time went (mapping the exports, the move, letting the mappings go, waiting for
copies in flight) next to each call's time as a rank sees it. The first `--warmup` rounds
(pinning host memory, mapping exports the first time) are not counted.

`--chunk-mb` and `--streams` set how copies are pipelined (`loom.state.copy`: chunks on several
CUDA streams); `--streams 0` copies each tensor whole, one at a time. Unset, the defaults hold.

On a machine with CUDA the device tier is the GPU and host memory is pinned, so the figures
compare with `bench_host_device_copy.py`'s pinned bandwidth (target: >= 80% of it); without
CUDA the device tier is CPU memory and the figures are memory-copy and disk rates.

`--json PATH` writes one results document (`loom.bench.results`): a record `"move"` per move
and tier with its median GB/s, each round's, and (through a sidecar) the median milliseconds of
the call and of its parts.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import torch

from loom.bench.script import add_json_option, write_json
from loom.state.manager import StateKey, StateManager
from loom.state.sidecar import SidecarConfig, StateSidecar
from loom.state.tiers import Tier

DIRS = ("offload->", "load<-")
_MOVE = re.compile("->|<-")


class Moves(NamedTuple):
    """What a run moves: one rank's tensors and their bytes, the tiers in turn, the copy
    settings, and the label the output names them by."""

    tensors: dict[StateKey, torch.Tensor]
    total: int
    tiers: list[Tier]
    copy: dict[str, int]
    label: str


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mb", type=int, default=512, help="unique state bytes (MiB)")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="rounds first, not counted")
    ap.add_argument("--via", choices=("process", "sidecar"), default="process")
    ap.add_argument("--tiers", default="host,disk", help="offload to these, in turn")
    ap.add_argument("--chunk-mb", type=float, default=None, help="copy chunk (MiB)")
    ap.add_argument("--streams", type=int, default=None, help="CUDA streams copies run on")
    ap.add_argument("--label", default=None, help="name this run in the output")
    add_json_option(ap)
    args = ap.parse_args()
    tiers = [Tier(t) for t in args.tiers.split(",")]
    if not tiers or Tier.DEVICE in tiers:
        ap.error("--tiers: host and/or disk")
    copy: dict[str, int] = {}
    if args.chunk_mb is not None:
        copy["copy_chunk_bytes"] = int(args.chunk_mb * 2**20)
    if args.streams is not None:
        copy["copy_streams"] = args.streams
    n = args.mb * 2**20
    tensors = {}
    per = 64 * 2**20  # 64 MiB tensors, half bf16 weights, half fp32 optimizer
    for i in range(max(1, n // per)):
        kind, dtype = ("weights", torch.bfloat16) if i % 2 == 0 else ("optimizer", torch.float32)
        numel = per // torch.tensor([], dtype=dtype).element_size()
        tensors[StateKey("m", kind, f"t{i}")] = torch.rand(numel).to(dtype)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    label = f"chunk_mb={args.chunk_mb} streams={args.streams}" if copy else "defaults"
    if args.label:
        label = f"{args.label}: {label}"
    moves = Moves(tensors, total, tiers, copy, label)
    records = (sidecar if args.via == "sidecar" else in_process)(moves, args)
    # the tensors' contents are torch's default random draws; nothing measured depends on them
    if out := write_json(args.json, "bench_state_manager", records, seed=0):
        print(f"wrote {len(records)} records to {out}")


def in_process(moves: Moves, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The moves through a StateManager in this process, all ranks at once."""
    tensors, total, tiers, copy, label = moves
    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        sm = StateManager(
            gpus=args.dp,
            device_bytes=2 * total,
            host_bytes=2 * total,
            disk_bytes=4 * total,
            disk_dir=Path(tmp),
            **copy,  # type: ignore[arg-type]
        )
        for rank in range(args.dp):
            sm.register("job", rank, rank, tensors)
        rows: dict[str, list[float]] = {f"{d}{t.value}": [] for t in tiers for d in DIRS}
        for i in range(args.warmup + args.repeats):
            if i == args.warmup:
                rows = {k: [] for k in rows}
            for tier in tiers:
                name = tier.value
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
        return report(rows, total, args, f"in process, {where}", label)


def report(
    rows: dict[str, list[float]],
    total: int,
    args: argparse.Namespace,
    where: str,
    label: str,
    parts: dict[str, dict[str, list[float]]] | None = None,
) -> list[dict[str, Any]]:
    """One line per move: the median GB/s, and (through a sidecar) the median milliseconds of
    the call as a rank sees it and of its parts in the sidecar; and a record of each."""
    print(f"{total / 2**20:.0f} MiB unique state, DP {args.dp}, copies: {label} ({where})")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    records = []
    for name, vals in rows.items():
        line = f"  {name:14s} {statistics.median(vals):6.2f} GB/s (median of {len(vals)})"
        ms = {k: statistics.median(v) * 1e3 for k, v in (parts or {}).get(name, {}).items()}
        if ms:
            line += "  ms: " + " ".join(f"{k} {v:.1f}" for k, v in ms.items())
        print(line)
        direction, tier = _MOVE.split(name)
        record = {"record": "move", "move": name, "direction": direction, "tier": tier}
        record |= {"device": device, "via": args.via, "copies": label, "where": where}
        record |= {"mb": args.mb, "unique_mib": total / 2**20, "dp": args.dp}
        record |= {"repeats": len(vals), "gb_s": statistics.median(vals), "gb_s_runs": vals}
        records.append(record | {f"{k}_ms": v for k, v in ms.items()})
    return records


def sidecar(moves: Moves, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The same moves through a sidecar process, the ranks as threads of this one."""
    tensors, total, tiers, copy, label = moves
    dp = args.dp
    device = "cuda" if torch.cuda.is_available() else "cpu"
    held = [{k: v.to(device) for k, v in tensors.items()} for _ in range(dp)]
    rows: dict[str, list[float]] = {f"{d}{t.value}": [] for t in tiers for d in DIRS}
    parts: dict[str, dict[str, list[float]]] = {k: {} for k in rows}
    with (
        tempfile.TemporaryDirectory() as tmp,
        StateSidecar(
            SidecarConfig(
                gpus=dp,
                device_bytes=2 * total,
                host_bytes=2 * total,
                disk_bytes=4 * total,
                disk_dir=tmp,
                **copy,  # type: ignore[arg-type]
            )
        ) as sc,
        sc.client() as watch,
    ):
        clients = [sc.client() for _ in range(dp)]

        def each(fn) -> list:  # type: ignore[no-untyped-def, type-arg]
            with ThreadPoolExecutor(dp) as pool:
                return list(pool.map(fn, range(dp)))

        def note(row: str, op: str, wall: float, before: dict) -> dict:  # type: ignore[type-arg]
            """The sidecar's counters since `before`, as parts of this call."""
            after = watch.call("stats")
            p = parts[row]
            p.setdefault("call", []).append(wall)
            t0, t1 = before.get("timings", {}).get(op, {}), after.get("timings", {}).get(op, {})
            for k in ("total_s", "map_s", "release_s"):
                if k in t1:
                    p.setdefault(k.removesuffix("_s"), []).append(t1[k] - t0.get(k, 0.0))
            if "copy" in after:
                w = after["copy"]["wait_s"] - before["copy"]["wait_s"]
                p.setdefault("wait", []).append(w)
            return after

        st = watch.call("stats")
        for i in range(args.warmup + args.repeats):
            if i == args.warmup:
                rows = {k: [] for k in rows}
                parts = {k: {} for k in rows}
            for tier in tiers:
                t = tier.value
                t0 = time.perf_counter()
                each(lambda r, h=held, t=t: clients[r].offload("job", r, dp, r, h[r], tier=t))
                wall = time.perf_counter() - t0
                rows[f"offload->{t}"].append(total / wall / 1e9)
                st = note(f"offload->{t}", "offload", wall, st)
                held = [{} for _ in range(dp)]
                t0 = time.perf_counter()
                got = each(lambda r: clients[r].load("job", r, dp, device=device))
                wall = time.perf_counter() - t0
                rows[f"load<-{t}"].append(dp * total / wall / 1e9)
                st = note(f"load<-{t}", "load", wall, st)
                held = [g.views for g in got]
        for cl in clients:
            cl.close()
    host = "pinned" if st["pinned_host"] else "pageable"
    where = f"via a sidecar, device {device}, host {host}, disk direct_io={st['direct_io']}"
    return report(rows, total, args, where, label, parts)


if __name__ == "__main__":
    main()
