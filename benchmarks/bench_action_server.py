"""The action server's system overhead on 1-second CPU actions (ARL-Tangram Table 1: at most
3% of execution time on AI-coding workloads).

Starts `loom serve actions` as its own process on loopback, then keeps as many actions in
flight as the server has cores (each client worker submits one, long-polls it to its end, and
submits the next), and reports per action the server's split of its completion time — queue,
overhead (grant to execution start: the pinned fork/exec), execution — and the client's view
(submit call to result in hand).

`--start-latency` instead runs `true` under each sandbox (`--sandbox bwrap` and `none`) and
reports what the sandbox adds to an action's start: grant to exit of a command that does
nothing, median and p99 (target: under 20 ms median).

Run: python benchmarks/bench_action_server.py [--n 32] [--seconds 1.0] [--busy] [--cores 0-7]
       [--sandbox bwrap|none] [--start-latency] [--json PATH]

`--json PATH` writes one results document (`loom.bench.results`): a record `"overhead"` (the
split of an action's completion time and the overhead's share of execution, server and client)
and `"paper"` per Table 1 row; with `--start-latency` a record `"start"` per sandbox and
`"added"` (what bubblewrap adds).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx

from loom.bench.script import add_json_option, write_json

Record = dict[str, Any]
PAPER = {"Coding (1280)": (0.975, 0.024), "Coding (1536)": (1.206, 0.036)}  # exec, overhead


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _command(seconds: float, busy: bool) -> list[str]:
    if not busy:
        return ["sleep", f"{seconds:g}"]
    loop = f"import time\nt = time.perf_counter()\nwhile time.perf_counter() - t < {seconds}: pass"
    return [sys.executable, "-c", loop]


async def _worker(
    http: httpx.AsyncClient, jobs: asyncio.Queue[int], body: dict[str, Any], out: list[dict]
) -> None:
    while True:
        try:
            i = jobs.get_nowait()
        except asyncio.QueueEmpty:
            return
        t0 = time.perf_counter()
        r = await http.post("/v1/actions", json={**body, "trajectory_id": f"t{i}"})
        r.raise_for_status()
        aid = r.json()["id"]
        while True:
            v = (await http.get(f"/v1/actions/{aid}", params={"wait_s": 30})).json()
            if v["status"] not in ("queued", "running"):
                break
        v["client_act_s"] = time.perf_counter() - t0
        out.append(v)


async def _drive(url: str, n: int, workers: int, body: dict[str, Any]) -> list[dict]:
    jobs: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        jobs.put_nowait(i)
    out: list[dict] = []
    limits = httpx.Limits(max_connections=workers + 2)
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=60, limits=limits) as h:
        await asyncio.gather(*(_worker(h, jobs, body, out) for _ in range(workers)))
    return out


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/healthz", trust_env=False).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise SystemExit("the server did not become healthy")


def _pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


class _Server:
    """`loom serve actions` as a process of its own on a free loopback port."""

    def __init__(self, work: str, cores: str | None, sandbox: str) -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "loom.cli", "serve", "actions", "--port", str(port)]
        cmd += ["--workdir", work, "--sandbox", sandbox] + (["--cores", cores] if cores else [])
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self) -> _Server:
        _wait_healthy(self.url, self.proc)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _start_latency(args: argparse.Namespace) -> list[Record]:
    n = args.n or 200
    starts: dict[str, list[float]] = {}
    for sandbox in ("none", "bwrap"):
        with (
            tempfile.TemporaryDirectory(prefix="bench-actions-") as work,
            _Server(work, args.cores, sandbox) as server,
        ):
            body = {"command": ["true"], "cpu": 1, "timeout_s": 60}
            asyncio.run(_drive(server.url, 10, 1, body))  # warm up
            views = asyncio.run(_drive(server.url, n, 1, body))
        bad = [v["status"] for v in views if v["status"] != "succeeded"]
        assert not bad, f"actions did not succeed under --sandbox {sandbox}: {bad}"
        starts[sandbox] = [v["overhead_s"] + v["exec_s"] for v in views]
    print(f"{n} actions running `true`, one at a time: grant to exit")
    records: list[Record] = []
    for sandbox, values in starts.items():
        med, p99 = statistics.median(values) * 1e3, _pct(values, 99) * 1e3
        print(f"  --sandbox {sandbox:<5}  median {med:6.2f} ms   p99 {p99:6.2f} ms")
        records.append(
            {"record": "start", "sandbox": sandbox, "actions": n, "median_ms": med, "p99_ms": p99}
        )
    added = [statistics.median(starts["bwrap"]) - statistics.median(starts["none"])]
    added.append(_pct(starts["bwrap"], 99) - _pct(starts["none"], 99))
    print(f"  added by bubblewrap: median {added[0] * 1e3:.2f} ms, p99 {added[1] * 1e3:.2f} ms")
    records.append(
        {
            "record": "added",
            "sandbox": "bwrap",
            "actions": n,
            "median_ms": added[0] * 1e3,
            "p99_ms": added[1] * 1e3,
            "target_median_ms": 20.0,
        }
    )
    return records


def _overhead(args: argparse.Namespace) -> list[Record]:
    with (
        tempfile.TemporaryDirectory(prefix="bench-actions-") as work,
        _Server(work, args.cores, args.sandbox) as server,
    ):
        stats = httpx.get(f"{server.url}/v1/stats", trust_env=False).json()
        cores = len(stats["cores"])
        n = args.n or 8 * cores
        body = {"command": _command(args.seconds, args.busy), "cpu": 1, "timeout_s": 60}
        t0 = time.perf_counter()
        views = asyncio.run(_drive(server.url, n, cores, body))
        wall = time.perf_counter() - t0

    bad = [v["status"] for v in views if v["status"] != "succeeded"]
    assert not bad, f"actions did not succeed: {bad}"
    exec_s = [v["exec_s"] for v in views]
    queue = [v["queue_s"] for v in views]
    overhead = [v["overhead_s"] for v in views]
    server_ratio = [(v["act_s"] - v["exec_s"]) / v["exec_s"] for v in views]
    client_ratio = [(v["client_act_s"] - v["exec_s"]) / v["exec_s"] for v in views]
    kind = "busy loop" if args.busy else "sleep"
    print(
        f"{n} x {args.seconds:g} s {kind} actions, {cores} in flight on {cores} cores, "
        f"--sandbox {args.sandbox}, {wall:.1f} s wall "
        f"({n * args.seconds / wall:.2f} cores busy on average)"
    )
    record: Record = {"record": "overhead", "actions": n, "action_s": args.seconds}
    record |= {"action": kind, "cores": cores, "sandbox": args.sandbox, "wall_s": wall}
    record |= {"cores_busy": n * args.seconds / wall, "exec_median_s": statistics.median(exec_s)}
    print(f"  exec      median {statistics.median(exec_s):.4f} s")
    for name, ms in (("queue", queue), ("overhead", overhead)):
        med, p95 = statistics.median(ms) * 1e3, _pct(ms, 95) * 1e3
        print(f"  {name:<9} median {med:7.2f} ms   p95 {p95:7.2f} ms")
        record |= {f"{name}_median_ms": med, f"{name}_p95_ms": p95}
    for name, ratio in (("server", server_ratio), ("client", client_ratio)):
        note = "  (with the HTTP submit and long-poll)" if name == "client" else ""
        print(
            f"  (ACT - exec) / exec, {name}: median {statistics.median(ratio):.2%}  "
            f"p95 {_pct(ratio, 95):.2%}{note}"
        )
        record[f"{name}_overhead_share_median"] = statistics.median(ratio)
        record[f"{name}_overhead_share_p95"] = _pct(ratio, 95)
    records = [record]
    for name, (ex, ov) in PAPER.items():
        print(f"  paper Table 1 {name}: overhead / exec = {ov / ex:.1%}")
        records.append(
            {
                "record": "paper",
                "workload": name,
                "exec_s": ex,
                "overhead_s": ov,
                "overhead_share": ov / ex,
            }
        )
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None, help="actions (default: 8 per core)")
    ap.add_argument("--seconds", type=float, default=1.0, help="duration of each action")
    ap.add_argument("--busy", action="store_true", help="a busy loop instead of sleep")
    ap.add_argument("--cores", default=None, help='cores to serve, e.g. "0-3"')
    ap.add_argument("--sandbox", default="bwrap", choices=["bwrap", "none"])
    ap.add_argument("--start-latency", action="store_true", help="what the sandbox adds to a start")
    add_json_option(ap)
    args = ap.parse_args()
    records = _start_latency(args) if args.start_latency else _overhead(args)
    if out := write_json(args.json, "bench_action_server", records, seed=0):
        print(f"wrote {len(records)} records to {out}")


if __name__ == "__main__":
    main()
