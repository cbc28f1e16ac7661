"""What `loom serve cluster` adds to an operation (target: Router + Scheduler overhead <= 5 ms
p50 on CPU): the median round trip of a small operation submitted over HTTP and awaited
(`POST .../ops`, `GET /v1/ops/{id}?wait_s=`), against the same operation called on the
worker-process group directly.

    python benchmarks/bench_cluster_service.py [--n 200] [--json PATH]

`--json PATH` writes one results document (`loom.bench.results`): a record `"op"` with both
medians and the service's overhead.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from loom.bench.script import add_json_option, write_json
from loom.runtime.cluster.app import BackgroundCluster, ClusterConfig
from loom.runtime.cluster.wpg import WorkerGroup, WorkerGroupConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--op", default="optim_step", help="the operation timed (a cheap one)")
    add_json_option(ap)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        with WorkerGroup(WorkerGroupConfig(name="direct", dp=1, state_dir=Path(tmp) / "d")) as g:
            direct = []
            for _ in range(args.n):
                t0 = time.perf_counter()
                g.run(args.op)
                direct.append(time.perf_counter() - t0)
        with (
            BackgroundCluster(ClusterConfig(port=0, state_dir=Path(tmp) / "s")) as svc,
            httpx.Client(base_url=svc.url, timeout=60) as http,
        ):
            dep = http.post("/v1/deployments", json={"job_id": "bench"}).json()["id"]
            served = []
            for _ in range(args.n):
                t0 = time.perf_counter()
                op = http.post(f"/v1/deployments/{dep}/ops", json={"op": args.op}).json()["op_id"]
                view = http.get(f"/v1/ops/{op}", params={"wait_s": 30}).json()
                served.append(time.perf_counter() - t0)
                assert view["status"] == "succeeded", view
    d, s = statistics.median(direct) * 1e3, statistics.median(served) * 1e3
    print(f"{args.op}: direct p50 {d:.2f} ms, through the service p50 {s:.2f} ms")
    print(f"service overhead p50 {s - d:.2f} ms (target <= 5 ms)")
    record = {"record": "op", "op": args.op, "n": args.n, "direct_p50_ms": d}
    record |= {"served_p50_ms": s, "overhead_p50_ms": s - d, "target_p50_ms": 5.0}
    if out := write_json(args.json, "bench_cluster_service", [record], seed=0):
        print(f"wrote 1 record to {out}")


if __name__ == "__main__":
    main()
