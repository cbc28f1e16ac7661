"""The rollout router's memory under continuous agentic load: `--trajectories` trajectories of
3 to 6 turns at a time, each replaced by a fresh one when it ends, for `--minutes`, against
stand-in engines; the router's resident memory (RSS) is sampled every `--every-s` seconds.
What a finished trajectory leaves is bounded by `history_limit`, so memory levels off once the
predictor's history window is full (and its first fit is done).

Run: python benchmarks/soak_router.py [--minutes 10] [--trajectories 400] [--json out.json]

The harness is `loom.bench` (`soak`); `--json PATH` writes one results document
(`loom.bench.results`): a record `"sample"` per sample (`t_s`, `rss_mb`, `finished`) and one
`"growth"` (over the second half and the whole run).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from loom.bench.fleet import StandinEngines
from loom.bench.progress import RunProgress
from loom.bench.results import results, write_results
from loom.bench.routers import ServedRouter
from loom.bench.soak import growth, soak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--trajectories", type=int, default=400)
    ap.add_argument("--every-s", type=float, default=30.0)
    ap.add_argument("--history-limit", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1, help="the trajectories' random draws")
    ap.add_argument("--json", default=None, metavar="PATH", help="write the results here")
    args = ap.parse_args()
    seconds = args.minutes * 60
    with (
        StandinEngines(2, "--step-ms", "2") as fleet,
        tempfile.TemporaryDirectory() as tmp,
    ):
        cfg = Path(tmp) / "router.toml"
        cfg.write_text(f"history_limit = {args.history_limit}\n")
        flags = ["--config", str(cfg)]
        for url in fleet.urls:
            flags += ["--engine", f"{url},max_running=64"]
        with ServedRouter(flags) as router, RunProgress(seconds, "soak (s)") as bar:

            def show(s: dict[str, Any]) -> None:
                bar.update(s["t_s"])
                print(
                    f"{s['t_s']:7.0f} s  RSS {s['rss_mb']:7.1f} MB  "
                    f"{s['finished']:6d} trajectories finished",
                    flush=True,
                )

            assert router.pid is not None, "a served router has a process of its own"
            samples = soak(
                router.url,
                router.pid,
                trajectories=args.trajectories,
                seconds=seconds,
                every_s=args.every_s,
                seed=args.seed,
                on_sample=show,
            )
    grew = growth(samples)
    print(
        f"second half: {grew['second_half_growth_mb']:+.1f} MB over "
        f"{grew['second_half_finished']:.0f} finished trajectories "
        f"({grew['growth_per_trajectory_kb']:+.2f} kB each); whole run "
        f"{grew['whole_run_growth_mb']:+.1f} MB"
    )
    if args.json:
        records = [{"record": "sample", **s} for s in samples]
        records.append(
            {
                "record": "growth",
                "trajectories": args.trajectories,
                "minutes": args.minutes,
                "history_limit": args.history_limit,
                **grew,
            }
        )
        doc = results("soak_router", records, seed=args.seed)
        print(f"wrote {len(records)} records to {write_results(args.json, doc)}")


if __name__ == "__main__":
    main()
