"""Heddle's whole system against the baselines on the fleets each would run, in the
simulator's served rollout (the router's own core in front of the emulated engines' model:
`loom.sim.rollout.served`), at paper scale: Qwen3-14B on `--gpus` emulated H100s, Heddle's
batch (512 trajectories of each workload), the router's predictor fitted on earlier epochs.

Every system runs on every uniform fleet (every engine at TP1, TP2, TP4 or TP8), on the
annealer's layout (Heddle §6, Formula 2, for a batch like the history's latest) and on
Heddle's planned layout (`loom plan rollout --simulate`: the annealed or a uniform layout,
whichever serves that batch fastest in the simulator); Heddle also runs its ablations on
both of its layouts: without KV copies (a move prefills the context again), with least-load
placement instead of its own, and with FCFS instead of PPS. Prints one table per workload: each
system's makespan per fleet, its best uniform fleet, and the ratios Heddle's targets name
(best baseline on its best uniform fleet over Heddle on its planned one; best baseline on the
planned fleet over Heddle there). Seconds are the emulated GPU's.

    python benchmarks/bench_heddle_layouts.py [--kinds coding,search,math] [--gpus 16]
        [--json docs/results/bench-heddle-layouts.json]

`--json PATH` writes one results document (`loom.bench.results`): a record `"run"` per
system, workload and fleet (makespan, migrations, KV copies, tokens prefilled again), and a
record `"workload"` per workload with the planned layout and the ratios.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from loom.bench.batch import BatchConfig, history_specs, scaled_batch, to_spec
from loom.bench.progress import RunProgress
from loom.bench.results import results, write_results
from loom.core.topology import GpuType
from loom.core.trajectory import TrajectorySpec, WorkloadKind
from loom.rollout.heddle.predictor import ProgressivePredictor
from loom.runtime.rollout.plan import PlanSettings, plan_rollout
from loom.sim.rollout.layouts import Fleet, served_on
from loom.sim.rollout.served import ServedResult

Record = dict[str, Any]

# name: (placement, scheduler, KV copies); the baselines as the other benchmarks run them
SYSTEMS = {
    "heddle": ("heddle", "pps", True),
    "verl": ("cache_aware", "rr", True),
    "slime": ("least_load", "rr", True),
    "verl*": ("hybrid", "rr", True),
}
ABLATIONS = {
    "heddle-no-kv-copies": ("heddle", "pps", False),
    "heddle-least-load": ("least_load", "pps", True),
    "heddle-fcfs": ("heddle", "fcfs", True),
}
BASELINES = ("verl", "slime", "verl*")


def run(
    specs: list[TrajectorySpec],
    history: list[TrajectorySpec],
    predictions: list[list[float]],
    degrees: tuple[int, ...],
    system: tuple[str, str, bool],
    args: argparse.Namespace,
) -> ServedResult:
    placement, scheduler, copies = system
    model, gpu = args.emulate.split("@")
    fleet = Fleet(
        model=model,
        gpu=GpuType(gpu),
        gpus=args.gpus,
        gpus_per_node=args.gpus_per_node,
        max_running=args.max_running,
    )
    return served_on(
        specs,
        degrees,
        fleet,
        placement=placement,
        scheduler=scheduler,
        move_kv=copies,
        predictions=predictions,
        history=history,  # Heddle plans with the history
    )


def workload(kind: str, args: argparse.Namespace, bar: RunProgress) -> list[Record]:
    config = BatchConfig(
        kind=WorkloadKind(kind),
        prompts=args.prompts,
        samples=args.samples,
        seed=args.seed,
        token_scale=1.0,
        tool_scale=1.0,
        max_turn_tokens=10**9,
        max_turns=48,
        history=args.history,
    )
    specs = [to_spec(s, t) for s, t in scaled_batch(config)]
    history = history_specs(config)
    predictions = [list(p) for p in ProgressivePredictor().fit(history).predict_steps(specs)]
    model, gpu = args.emulate.split("@")
    settings = PlanSettings(
        gpus=args.gpus,
        model=model,
        gpu=gpu,
        batch=len(specs),
        max_running=args.max_running,
        simulate=args.simulate_plan,
    )
    plan = plan_rollout(history, settings)  # for a batch like the latest epoch
    fleets = {f"uniform-tp{d}": (d,) * (args.gpus // d) for d in args.degrees}
    fleets["annealed"] = plan.annealed
    fleets["planned"] = plan.degrees
    records: list[Record] = []
    cases = list(SYSTEMS.items()) + list(ABLATIONS.items())
    done: dict[tuple[str, tuple[int, ...]], Record] = {}  # a layout two fleets share runs once
    for name, system in cases:
        for fleet, degrees in fleets.items():
            if name in ABLATIONS and fleet not in ("annealed", "planned"):
                continue
            bar.step(f"{kind} {name} {fleet}")
            same = done.get((name, degrees))
            if same is None:
                began = time.perf_counter()
                res = run(specs, history, predictions, degrees, system, args)
                same = done[name, degrees] = {
                    "makespan_s": res.makespan_s,
                    "migrations": res.counts["migrations"],
                    "kv_copies": res.counts["kv_copies"],
                    "reprefill_tokens": sum(res.reprefill.values()),
                    "prefill_tokens": res.prefill_tokens,
                    "cache_hit_tokens": res.cache_hit_tokens,
                    "sim_wall_s": time.perf_counter() - began,
                }
            bar.advance()
            records.append(
                {
                    "record": "run",
                    "workload": kind,
                    "system": name,
                    "fleet": fleet,
                    "layout": list(degrees),
                    **same,
                }
            )
    records.append(
        _summary(kind, plan.degrees, records, len(specs))
        | {
            "annealed_layout": list(plan.annealed),
            **{f"plan_simulated_{'-'.join(map(str, d))}_s": m for d, m in plan.simulated},
        }
    )
    return records


def _summary(kind: str, planned: tuple[int, ...], runs: list[Record], n: int) -> Record:
    def span(system: str, fleet: str) -> float:
        return next(r["makespan_s"] for r in runs if r["system"] == system and r["fleet"] == fleet)

    uniform = sorted({r["fleet"] for r in runs if r["fleet"].startswith("uniform")})
    best = {s: min(uniform, key=lambda f, s=s: span(s, f)) for s in SYSTEMS}
    heddle = span("heddle", "planned")
    best_baseline = min(span(s, best[s]) for s in BASELINES)
    return {
        "record": "workload",
        "workload": kind,
        "trajectories": n,
        "planned_layout": list(planned),
        **{f"best_uniform_{s}": best[s] for s in SYSTEMS},
        "heddle_planned_s": heddle,
        "heddle_best_uniform_s": span("heddle", best["heddle"]),
        "heddle_annealed_s": span("heddle", "annealed"),
        "best_baseline_uniform_over_heddle_planned": best_baseline / heddle,
        "best_baseline_planned_over_heddle_planned": min(span(s, "planned") for s in BASELINES)
        / heddle,
        "best_baseline_uniform_over_heddle_best_uniform": best_baseline
        / span("heddle", best["heddle"]),
        **{f"{a}_over_heddle": span(a, "planned") / heddle for a in ABLATIONS},
        **{
            f"{a}_over_heddle_annealed": span(a, "annealed") / span("heddle", "annealed")
            for a in ABLATIONS
        },
    }


def show(records: list[Record]) -> None:
    for w in [r for r in records if r["record"] == "workload"]:
        kind = w["workload"]
        runs = [r for r in records if r["record"] == "run" and r["workload"] == kind]
        fleets = list(dict.fromkeys(r["fleet"] for r in runs))
        print(
            f"\n{kind}: {w['trajectories']} trajectories, planned layout {w['planned_layout']} "
            f"(annealed {w['annealed_layout']})"
        )
        print(f"{'system':>22} " + " ".join(f"{f:>13}" for f in fleets))
        for system in dict.fromkeys(r["system"] for r in runs):
            cells = {r["fleet"]: r["makespan_s"] for r in runs if r["system"] == system}
            print(
                f"{system:>22} "
                + " ".join(f"{cells[f]:>12.1f}s" if f in cells else f"{'':>13}" for f in fleets)
            )
        print(
            f"best baseline on its best uniform fleet / heddle planned: "
            f"{w['best_baseline_uniform_over_heddle_planned']:.2f}x; on the planned fleet: "
            f"{w['best_baseline_planned_over_heddle_planned']:.2f}x; heddle on its best uniform "
            f"fleet ({w['best_uniform_heddle']}): "
            f"{w['best_baseline_uniform_over_heddle_best_uniform']:.2f}x"
        )
        for fleet, suffix in (("planned", ""), ("annealed", "_annealed")):
            print(
                f"ablations on the {fleet} fleet (makespan over heddle's): "
                + ", ".join(f"{a} {w[f'{a}_over_heddle{suffix}']:.2f}x" for a in ABLATIONS)
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default="coding,search,math")
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--emulate", default="qwen3-14b@h100", help="MODEL@GPU")
    ap.add_argument("--degrees", default="1,2,4,8", help="uniform fleets' degrees")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--history", type=int, default=3, help="earlier epochs for the predictor")
    ap.add_argument("--max-running", type=int, default=1024, help="router's cap per engine")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--no-simulate-plan",
        dest="simulate_plan",
        action="store_false",
        help="keep the annealer's layout (Formula 2) without checking it in the simulator",
    )
    ap.add_argument("--json", default=None, metavar="PATH")
    args = ap.parse_args()
    args.degrees = tuple(int(d) for d in args.degrees.split(","))
    kinds = args.kinds.split(",")
    per_kind = len(SYSTEMS) * (len(args.degrees) + 2) + 2 * len(ABLATIONS)
    records: list[Record] = []
    with RunProgress(per_kind * len(kinds), "runs") as bar:
        for kind in kinds:
            records += workload(kind, args, bar)
    show(records)
    if args.json:
        path = write_results(args.json, results("bench_heddle_layouts", records, seed=args.seed))
        print(f"wrote {len(records)} records to {path}")


if __name__ == "__main__":
    main()
