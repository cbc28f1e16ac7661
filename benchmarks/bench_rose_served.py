"""ROSE served (issue 38): one RL step's agentic batch through Loom's router (`--placement
rose`) on 8 dedicated emulated H800s and 0, 4, 8 or 16 lent ones that co-serve the serving
model (`loom serve engine --emulate ... --coserve`, PD roles 1:3), with the serving day
replayed against the lent engines meanwhile (`loom.bench.serving_load`); the simulator's
`RoseRollout` on the same batch and serving window beside each.

    python benchmarks/bench_rose_served.py [--lent 0,4,8,16] [--dedicated 8] [--groups 16]
        [--time-scale 0.2] [--seed 1] [--json PATH]

Per number of lent GPUs: the rollout time (emulated seconds: wall / time scale), the serving
requests that ended during it and the shares within the TTFT and TPOT SLOs, the turns the
router moved off lent engines (taken back for serving, or stalled), and the simulator's
rollout time and SLO shares; and, for each lent fleet, serving alone (no rollout) over the
window the rollout took, the attainment the rollout must not lower. Qwen3-8B's workload of
ROSE §6 (Frozen-Lake, App. E), `--groups` groups of 16 samples (16: the paper's 256
trajectories). The router, the serving load and each engine run in processes of their own.

`--json PATH` writes one results document (`loom.bench.results`): a record `"served"` per
number of lent GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import time
from dataclasses import replace
from typing import Any

import numpy as np

from loom.bench.script import add_json_option, write_json

SPEC = "qwen3-8b@h800"


def _roles(n: int) -> list[str]:
    from loom.experiments.rose_steps import PREFILL_EVERY

    return ["prefill" if i % PREFILL_EVERY == 0 else "decode" for i in range(n)]


def _share(xs: Any, slo: float) -> float:
    xs = np.asarray(xs, dtype=float)
    return float(np.mean(xs <= slo)) if len(xs) else math.nan


def simulate(wl: Any, specs: list[Any], lent: int, day: Any) -> dict[str, Any]:
    from loom.experiments import rose_steps as steps
    from loom.rollout.rose.scheduler import ROSE_ROUTERS, RoutingKind

    res = steps._simulation(
        wl,
        specs,
        router=ROSE_ROUTERS.get(RoutingKind.ROSE)(),
        dedicated_tp=[wl.rollout_tp] * (wl.rollout_gpus // wl.rollout_tp),
        lent=steps.lent_instances(wl, replace(steps.ROSE, lent_gpus=lent)),
        serving=day,
        serving_offset_s=steps.DAY_OFFSET_S,
    ).run()
    return {
        "sim_rollout_s": res.makespan_s,
        "sim_serving_ended": len(res.tpot_s),
        "sim_ttft_attainment": _share(res.ttft_s, wl.slo_ttft_s),
        "sim_tpot_attainment": _share(res.tpot_s, wl.slo_tpot_s),
        "sim_moved": res.aborts,
    }


async def _served(
    wl: Any, specs: list[Any], lent: int, rps: float, seed: int, scale: float, horizon_s: float
) -> dict[str, Any]:
    """The batch `specs` through the router (none: serving alone for `horizon_s`), the
    serving day from 10:00 on the lent engines meanwhile. The router (`loom serve rollout`)
    and the serving load (`python -m loom.bench.serving_load`) run in processes of their own,
    apart from the agents: on two cores one process doing all three held the agents back."""
    import json
    import signal
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    import httpx

    from loom.bench.batch import Turn, draw_tokens
    from loom.bench.replay import run_batch
    from loom.bench.routers import ServedRouter
    from loom.experiments.rose_steps import DAY_OFFSET_S
    from loom.proc.tether import Tethered
    from loom.runtime.emulate import EmulatedProcess

    batch = [
        (s, [Turn(t.input_tokens, t.output_tokens, t.tool_latency_s) for t in s.turns])
        for s in specs
    ]
    draws = draw_tokens(batch, 1)
    args = ("--time-scale", str(scale))
    rollout = bool(specs)
    out: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="loom-rose-")))
        dedicated = [
            stack.enter_context(EmulatedProcess(SPEC, *args, "--max-running", "16"))
            for _ in range(wl.rollout_gpus // wl.rollout_tp if rollout else 0)
        ]
        roles = _roles(lent)
        lent_engines = [
            stack.enter_context(
                EmulatedProcess(SPEC, *args, "--coserve", wl.serving_model, "--role", role)
            )
            for role in roles
        ]
        serving = None
        if lent and rps > 0:
            urls = [f"--{role}={e.url}" for e, role in zip(lent_engines, roles, strict=True)]
            # tethered: a benchmark killed by SIGKILL leaves no replay running
            serving = Tethered(
                [sys.executable, "-m", "loom.bench.serving_load", *urls,
                 "--model", wl.serving_model, "--rps", repr(rps), "--seed", str(seed),
                 "--offset-s", repr(DAY_OFFSET_S), "--horizon-s", repr(horizon_s),
                 "--time-scale", str(scale), "--ttft-slo-s", repr(wl.slo_ttft_s),
                 "--tpot-slo-s", repr(wl.slo_tpot_s), "--out", str(tmp / "serving.json")],
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
        try:
            if rollout:
                config = tmp / "router.json"
                engines = [{"url": e.url, "id": f"d{i}"} for i, e in enumerate(dedicated)]
                engines += [
                    {"url": e.url, "id": f"l{i}", "lent": True} for i, e in enumerate(lent_engines)
                ]
                config.write_text(
                    json.dumps(
                        {
                            "engines": engines,
                            "placement": "rose",
                            "rose_cap_per_gpu": wl.max_running_per_gpu,
                            "load_interval_s": 0.2,
                        }
                    )
                )
                router = stack.enter_context(ServedRouter(["--config", str(config)]))
                t0 = time.perf_counter()
                got = await run_batch(router.url, batch, draws, scale)
                out["rollout_s"] = (time.perf_counter() - t0) / scale
                out["tokens"] = got["tokens"]
                async with httpx.AsyncClient(base_url=router.url) as http:
                    policy = (await http.get("/v1/stats")).json()["policy"]
                out["moved"] = policy["reclaimed"] + policy["stalls"]
                if serving is not None:
                    serving.send_signal(signal.SIGTERM)
            if serving is not None:
                serving.wait(horizon_s * scale + 600)
                summary = json.loads((tmp / "serving.json").read_text())["summary"]
                out.update(
                    serving_ended=summary["ended"],
                    serving_failed=summary["failed"],
                    ttft_attainment=summary["ttft_attainment"],
                    tpot_attainment=summary["tpot_attainment"],
                )
        finally:
            if serving is not None and serving.poll() is None:
                serving.kill()
                serving.wait()
    return out


def bench(lent: int, groups: int, scale: float, seed: int, dedicated: int = 8) -> dict[str, Any]:
    from loom.experiments import rose_steps as steps
    from loom.sim.workloads.rose import ROSE_WORKLOADS

    wl = replace(ROSE_WORKLOADS["8b"], rollout_gpus=dedicated)
    specs = list(wl.sample(0, n_groups=groups))
    rps = steps.serving_rate(wl, lent)
    day = steps._day(rps, 1.0, seed) if rps > 0 else None
    row: dict[str, Any] = {
        "record": "served",
        "lent_gpus": lent,
        "dedicated_gpus": dedicated,
        "trajectories": len(specs),
    }
    row["serving_rps"] = rps
    row.update(
        serving_ended=0,
        serving_failed=0,
        ttft_attainment=math.nan,
        tpot_attainment=math.nan,
    )
    row.update(asyncio.run(_served(wl, specs, lent, rps, seed, scale, 4 * 3600.0)))
    row.update(simulate(wl, specs, lent, day))
    row["served_over_simulated"] = row["rollout_s"] / row["sim_rollout_s"]
    if lent and day is not None:
        # serving alone over the window the rollout ran beside it
        alone = asyncio.run(_served(wl, [], lent, rps, seed, scale, row["rollout_s"]))
        row["alone_ttft_attainment"] = alone["ttft_attainment"]
        row["alone_tpot_attainment"] = alone["tpot_attainment"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lent", default="0,4,8,16")
    parser.add_argument(
        "--dedicated", type=int, default=8, help="the job's own GPUs (§6: 8 for Qwen3-8B)"
    )
    parser.add_argument("--groups", type=int, default=16, help="groups of 16 trajectories")
    parser.add_argument("--time-scale", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1, help="the serving day's")
    add_json_option(parser)
    args = parser.parse_args()
    rows = []
    for lent in (int(x) for x in args.lent.split(",")):
        r = bench(lent, args.groups, args.time_scale, args.seed, args.dedicated)
        rows.append(r)
        alone = (
            f", alone {r['alone_ttft_attainment']:.3f} / {r['alone_tpot_attainment']:.3f}"
            if "alone_ttft_attainment" in r
            else ""
        )
        print(
            f"{lent:>2} lent GPUs: rollout {r['rollout_s']:.0f} s (simulated "
            f"{r['sim_rollout_s']:.0f} s, {r['served_over_simulated']:.2f}x), {r['moved']} turns "
            f"moved off lent engines; serving {r['serving_ended']} requests, TTFT / TPOT "
            f"within SLO {r['ttft_attainment']:.3f} / {r['tpot_attainment']:.3f} (simulated "
            f"{r['sim_ttft_attainment']:.3f} / {r['sim_tpot_attainment']:.3f}{alone})",
            flush=True,
        )
    if out := write_json(args.json, "bench_rose_served", rows, seed=args.seed):
        print(f"wrote {len(rows)} records to {out}")


if __name__ == "__main__":
    main()
