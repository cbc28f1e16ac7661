"""One agentic batch through the rollout router over real engines, under each rollout system:
heddle (heddle + pps), verl (cache_aware + rr), slime (least_load + rr) and verl* (hybrid +
rr); and, as a peer, through sglang-router with its own policies (`sglang:cache_aware`,
`sglang:power_of_two`, `sglang:round_robin`, `sglang:manual`) over the same engines. Reports
makespan and throughput, and their ratios against Heddle.

The batch is the workload generator's (`loom.sim.workloads.agentic`): its trajectories'
turns, output lengths and tool latencies, scaled down (`--token-scale`, `--tool-scale`,
`--max-turn-tokens`) to finish in minutes on two CPU cores. Each trajectory is an agent:
declare the batch, then per turn send the context so far (prompt, earlier outputs and tool
replies, as token ids) with `max_tokens` = the turn's length and `ignore_eos`, sleep the tool
latency, append the tool's reply, and end the trajectory after its last turn.

Engines: `--vllm N` starts N vLLM CPU engines on the tiny model (the `engine` extra),
`--standin N` N stand-in SGLang engines, or `--engine URL ...` uses running ones.

Two settings of issue 28:

* Paper scale on emulated GPUs (`--emulate qwen3-14b@h100:tp2 --engines 8`): engines that
  behave like the GPU (`loom serve engine --emulate`: the simulator's worker on a wall clock
  scaled by `--time-scale`), Heddle's batch unscaled (`--prompts 32 --samples 16`: 512
  trajectories of each of `--kinds`), tool latencies slept at the same time scale. Makespans
  are reported in GPU seconds (wall / time scale), beside the simulator's for the same batch
  (`sim_s`, the same policies on the same worker model; KV is not moved, as the router cannot),
  with the router's CPU per turn and its share of the run's CPU.
* Real vLLM CPU engines, saturated (`--vllm 2 --max-running 4 --prompts 12 --samples 4
  --repeats 5`): engines capped so that they queue, a long-tailed batch of 48 trajectories.

Run: python benchmarks/bench_rollout_runtime.py --vllm 2 [--kind coding] [--prompts 4]
     [--samples 4] [--max-running 4] [--json out.json]
     python benchmarks/bench_rollout_runtime.py --emulate qwen3-14b@h100:tp2 --engines 8
     --time-scale 0.2 [--kinds coding,search,math] [--repeats 3] [--json out.json]

The harness is `loom.bench`; `--json PATH` writes one results document (`loom.bench.results`)
whose records are one per run (`"record": "run"`), one per system and workload (`"system"`:
medians, runs, spread, ratio to Heddle's, simulated), one per workload (`"workload"`: the
batch, and the targets' ratios) and, with the simulator over profiled engines, the served
profile's rows (`"profile"`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from loom.bench.batch import (
    BatchConfig,
    batch_size,
    draw_tokens,
    history_specs,
    scaled_batch,
    write_history,
)
from loom.bench.calibrate import calibrate, write_served_profile
from loom.bench.fleet import (
    TINY_PROFILE,
    EmulatedEngines,
    Fleet,
    RunningEngines,
    StandinEngines,
    VllmEngines,
)
from loom.bench.measure import CPU_CLASSES, cpu_by_class, round_trip_s
from loom.bench.progress import RunProgress
from loom.bench.results import results, write_results
from loom.bench.settings import RouterSetup, router_setting
from loom.bench.simulate import simulate, simulate_emulated
from loom.bench.summary import (
    SIM_FIELDS,
    across_fleets,
    print_across,
    profile_records,
    run_record,
    simulated,
    system_record,
    targets,
    with_vs_heddle,
)
from loom.bench.systems import Bench, InProcess, Launch, Served, System, UnknownSystemError, system
from loom.core.trajectory import WorkloadKind

Record = dict[str, Any]


ALL_PEERS = "sglang:cache_aware,sglang:power_of_two,sglang:round_robin,sglang:manual"


def _systems(names: str) -> list[System]:
    try:
        return [system(s) for s in names.split(",") if s]
    except UnknownSystemError as exc:
        raise SystemExit(str(exc)) from None


def _batch(args: argparse.Namespace, kind: str) -> BatchConfig:
    return BatchConfig(
        kind=WorkloadKind(kind),
        prompts=args.prompts,
        samples=args.samples,
        seed=args.seed,
        token_scale=args.token_scale,
        tool_scale=args.tool_scale,
        max_turn_tokens=args.max_turn_tokens,
        max_turns=args.max_turns,
        history=args.history,
    )


def _fleet(args: argparse.Namespace, layout: tuple[int, ...] | None = None) -> Fleet:
    if args.emulate:
        return EmulatedEngines(
            args.emulate,
            args.engines,
            time_scale=args.time_scale,
            max_running=args.engine_max_running,
            stream_interval_ms=args.stream_interval_ms,
            layout=layout,
        )
    if args.engine:
        return RunningEngines(args.engine, profiles=(TINY_PROFILE,) if args.simulate else ())
    if args.vllm:
        return VllmEngines(args.vllm, max_running=args.max_running)
    return StandinEngines(args.standin, "--step-ms", "5")


def _launch(args: argparse.Namespace) -> Launch:
    return InProcess() if args.in_process else Served()


def _setup(args: argparse.Namespace, fleet: Fleet) -> RouterSetup:
    return fleet.router_setup(
        max_running=args.max_running, queue=args.engine_queue, settings=dict(args.router_set)
    )


def per_turn(r: Record) -> str:
    if r["queue_s_per_turn"] is None:
        return "-"
    return (
        f"queue {r['queue_s_per_turn']:.3f} s, first token {r['first_token_s_per_turn']:.3f} s, "
        f"decode {r['decode_s_per_turn']:.3f} s"
    )


def _engine_counts(r: Record) -> str:
    return ", ".join(f"{k[7:]} {v:.0f}" for k, v in r.items() if k.startswith("engine_"))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main_emulated(args: argparse.Namespace) -> list[Record]:
    """Issue 28's paper-scale setting: every workload of `--kinds`, each Loom system and each
    peer run `--repeats` times, interleaved, over the same emulated engines; the simulator's
    makespan of the same batch beside each Loom system's. With `--layouts`, each workload on
    each fleet in turn (its engines started afresh), and a comparison across the fleets."""
    systems, peers = _systems(args.systems), _systems(args.peers)
    kinds = args.kinds.split(",")
    layouts = args.layouts.split(",") if args.layouts else [""]
    records: list[Record] = []
    total = len(kinds) * len(layouts) * args.repeats * len(systems + peers)
    with tempfile.TemporaryDirectory() as tmp, RunProgress(total, "runs") as bar:
        for kind in kinds:
            config = _batch(args, kind)
            batch = scaled_batch(config)
            n_traj, n_turns, n_tokens = batch_size(batch)
            print(f"{kind}: {n_traj} trajectories, {n_turns} turns, {n_tokens} output tokens")
            work = Path(tmp) / kind
            work.mkdir()
            n_hist = write_history(config, work) if args.history else 0
            mine: list[Record] = []
            for name in layouts:
                layout = _layout(args, name, config, n_traj)
                fleet = _fleet(args, layout)
                with fleet:
                    print(f"{kind} on {name or 'the fleet'}: {fleet.describe()}")
                    mine += _workload(
                        args, kind, name, fleet, config, batch, work, n_hist, systems, peers, bar
                    )
            if len(layouts) > 1:
                mine.append(across_fleets(kind, mine))
                print_across(mine[-1])
            records += mine
    return records


def _layout(
    args: argparse.Namespace, name: str, config: BatchConfig, n_traj: int
) -> tuple[int, ...] | None:
    """`--layouts` entry `name` as degrees: `NxD` (N engines of degree D), `planned`
    (Heddle's plan for the workload's history, checked in the simulator), "" (the fleet of
    `--emulate` and `--engines`)."""
    if not name:
        return None
    if name == "planned":
        from loom.runtime.rollout.plan import PlanSettings, plan_rollout

        model, _, gpu = args.emulate.partition(":")[0].partition("@")
        settings = PlanSettings(
            gpus=args.gpus, model=model, gpu=gpu, batch=n_traj,
            max_running=args.engine_max_running, simulate=True,
        )  # fmt: skip
        plan = plan_rollout(history_specs(config), settings)
        print(f"planned {plan.degrees} (annealed {plan.annealed}); simulated {plan.simulated}")
        return plan.degrees
    count, x, degree = name.partition("x")
    if not x or not count.isdigit() or not degree.isdigit():
        raise SystemExit(f"--layouts: {name!r} is neither NxD (e.g. 8x2) nor planned")
    return (int(degree),) * int(count)


def _workload(
    args: argparse.Namespace,
    kind: str,
    layout: str,
    fleet: Fleet,
    config: BatchConfig,
    batch: Any,
    work: Path,
    n_hist: int,
    systems: list[System],
    peers: list[System],
    bar: RunProgress,
) -> list[Record]:
    """One workload on one fleet: every system `--repeats` times, interleaved."""
    n_traj, n_turns, n_tokens = batch_size(batch)
    setup = _setup(args, fleet)
    model = fleet.model_name()
    rtt = round_trip_s(fleet.urls[0])
    print(f"HTTP round trip on loopback {1e3 * rtt:.2f} ms wall")
    bench = Bench(
        fleet=fleet, setup=setup, work=work, history=n_hist, launch=_launch(args), model=model,
    )  # fmt: skip
    n_engines = len(fleet.urls)
    sims = {
        s.name: simulate_emulated(
            config,
            s.setup(setup),
            s.policies,
            batch,
            n_engines,
            engine_max_running=args.engine_max_running,
        )
        for s in systems
        if s.policies is not None
    }
    for name, res in sims.items():
        print(
            f"  simulated {name:>8}: {res.makespan_s:8.1f} s, preemptions "
            f"{res.preemptions}, prefilled {res.prefill_tokens}, cached "
            f"{res.cache_hit_tokens}, migrations {res.migrations}",
            flush=True,
        )
    draws = draw_tokens(batch, args.seed)
    runs: dict[str, list[Record]] = {}
    records: list[Record] = []
    where = {"fleet": layout} if layout else {}
    for rep in range(args.repeats):  # systems interleaved: drift hits all alike
        for s in systems + peers:
            bar.step(f"{kind} {layout} {s.name} #{rep}")
            r = run_record(s.run(bench, batch, draws), workload=kind, repeat=rep, turns=n_turns)
            r |= where
            runs.setdefault(s.name, []).append(r)
            records.append(r)
            print(
                f"  {s.name:>19} #{rep}: makespan {r['makespan_s']:7.1f} s "
                f"(wall {r['wall_s']:.0f} s), preemptions {r['preemptions']}, "
                f"router CPU {_ms(r['router_cpu_ms_per_turn'])} ms/turn "
                f"({100 * (r['router_cpu_share'] or 0.0):.0f}% of the run's "
                f"{r['run_cpu_s']:.1f} CPU s: engines {r['engines_cpu_s']:.1f}, "
                f"agents {r['agents_cpu_s']:.1f}); per turn: {per_turn(r)}; "
                f"engines: {_engine_counts(r)}",
                flush=True,
            )
            bar.advance()
    rows = []
    for s in systems + peers:
        row = system_record(runs[s.name]) | where
        row |= _simulated(args, config, setup, s, batch, rtt, row, sims, n_engines)
        rows.append(row)
    rows = with_vs_heddle(rows)
    _report(kind, rows)
    records += rows
    records.append(
        {
            "record": "workload",
            "workload": kind,
            **where,
            "trajectories": n_traj,
            "turns": n_turns,
            "output_tokens": n_tokens,
            "history_trajectories": n_hist,
            "engines": n_engines,
            "layout": [tp for tp, _ in setup.slots] or [setup.tp] * n_engines,
            "emulate": args.emulate,
            "time_scale": args.time_scale,
            "round_trip_ms": 1e3 * rtt,
            **targets(rows),
        }
    )
    return records


def _simulated(
    args: argparse.Namespace,
    config: BatchConfig,
    setup: RouterSetup,
    s: System,
    batch: Any,
    rtt: float,
    row: Record,
    sims: dict[str, Any],
    n_engines: int,
) -> Record:
    """The simulator's figures beside a system's summary: bare, and with the served router
    modelled (its CPU per turn, spent one turn at a time: one event loop; and two round trips
    per turn, agent to router and router to engine), in GPU seconds; None for a peer."""
    if s.policies is None or s.name not in sims:
        return dict.fromkeys(SIM_FIELDS)
    decision = (row["router_cpu_ms_per_turn"] or 0.0) / 1e3 / args.time_scale
    routed = simulate_emulated(
        config, s.setup(setup), s.policies, batch, n_engines,
        engine_max_running=args.engine_max_running,
        dispatch_s=2 * rtt / args.time_scale, decision_s=decision,
    )  # fmt: skip
    return simulated(row["makespan_s"], sims[s.name], routed, decision)


def _report(kind: str, rows: list[Record]) -> None:
    print(
        f"{kind}: median makespan (GPU s), spread (max-min)/median, makespan / heddle's, "
        "real/simulated:"
    )
    for r in rows:
        sim = ""
        if r["sim_s"] is not None:
            sim = (
                f", sim {r['sim_s']:.1f} s, real/sim {r['real_over_sim']:.3f}; with the router's "
                f"{r['sim_decision_s']:.3f} s/turn: sim {r['sim_routed_s']:.1f} s, real/sim "
                f"{r['real_over_sim_routed']:.3f}"
            )
        vs = float("nan") if r["vs_heddle"] is None else r["vs_heddle"]
        share = "-" if r["router_cpu_share"] is None else f"{100 * r['router_cpu_share']:.1f}"
        print(
            f"  {r['system']:>19}: {r['makespan_s']:8.1f} s (spread {100 * r['spread']:.1f}%), "
            f"x{vs:.3f}{sim}; router {_ms(r['router_cpu_ms_per_turn'])} ms CPU/turn, "
            f"{share}% of the run's CPU"
        )
    got = targets(rows)
    if got["best_baseline_over_heddle"] is not None:
        print(
            f"  best of verl/slime/verl* / heddle: {got['best_baseline_over_heddle']:.3f} "
            "(target >= 1.2)"
        )
    if got["best_peer_over_heddle"] is not None:
        print(
            f"  best sglang-router policy / heddle: {got['best_peer_over_heddle']:.3f} "
            "(target >= 1.3)"
        )


def main_real(args: argparse.Namespace) -> list[Record]:
    """One workload (`--kind`) over stand-in, vLLM CPU or running engines: each system run
    `--repeats` times, interleaved; with profiled engines, the simulator beside each Loom
    system; sglang-router's policies (`--peers`) over the same engines."""
    systems = _systems(args.systems) + _systems(args.peers)
    config = _batch(args, args.kind)
    batch = scaled_batch(config)
    n_traj, n_turns, n_tokens = batch_size(batch)
    print(f"batch: {n_traj} trajectories, {n_turns} turns, {n_tokens} output tokens", flush=True)
    records: list[Record] = []
    fleet = _fleet(args)
    with fleet, tempfile.TemporaryDirectory() as tmp:
        setup = _setup(args, fleet)
        n_engines = len(fleet.urls)
        n_hist = write_history(config, Path(tmp)) if args.history else 0
        print(f"history: {n_hist} trajectories from {args.history} earlier epochs")
        bench = Bench(
            fleet=fleet, setup=setup, work=Path(tmp), history=n_hist, launch=_launch(args),
            model=fleet.model_name(),
        )  # fmt: skip
        draws = draw_tokens(batch, args.seed)
        runs: dict[str, list[Record]] = {}
        with RunProgress(args.repeats * len(systems), "runs") as bar:
            for rep in range(args.repeats):  # systems interleaved: drift hits all alike
                for s in systems:
                    bar.step(f"{s.name} #{rep}")
                    before = cpu_by_class() if args.cpu else {}
                    row = s.run(bench, batch, draws)
                    r = run_record(row, workload=args.kind, repeat=rep, turns=n_turns)
                    if args.cpu:
                        r |= _cpu_by_class(before, r)
                    runs.setdefault(s.name, []).append(r)
                    records.append(r)
                    print(
                        f"{s.name:>16} #{rep}: makespan {r['makespan_s']:7.1f} s, "
                        f"{r['throughput_tok_s']:7.1f} tok/s, preemptions {r['preemptions']}, "
                        f"migrations {r['migrations']}; per turn: {per_turn(r)}",
                        flush=True,
                    )
                    bar.advance()
        rows = [system_record(got) for got in runs.values()]
        if fleet.profiles():  # the simulator against the same engines, as served
            records += _simulate_served(args, config, setup, fleet, batch, systems, rows, tmp)
    rows = with_vs_heddle(rows)
    if any(r["system"] == "heddle" for r in rows):
        print(
            "median makespan / heddle's (above 1: slower than heddle):",
            ", ".join(f"{r['system']} {r['vs_heddle']:.3f}" for r in rows),
        )
    records += rows
    records.append(
        {
            "record": "workload",
            "workload": args.kind,
            "trajectories": n_traj,
            "turns": n_turns,
            "output_tokens": n_tokens,
            "history_trajectories": n_hist,
            "engines": n_engines,
            **targets(rows),
        }
    )
    return records


def _cpu_by_class(before: dict[str, float], r: Record) -> Record:
    """CPU seconds by class of process over a run, printed and as `cpu_<class>_s`."""
    after = cpu_by_class()
    used = {k: v - before.get(k, 0.0) for k, v in after.items()}
    labels = dict(CPU_CLASSES)
    if r["router_cpu_s"] is not None:
        used["router"] = r["router_cpu_s"]
        labels["router"] = "router"
    print(
        f"{r['system']:>16} #{r['repeat']}: CPU seconds over {r['makespan_s']:.1f} s of "
        f"{os.cpu_count()} cores: "
        + ", ".join(f"{labels[k]} {v:.1f}" for k, v in used.items() if v > 0.05)
    )
    return {f"cpu_{k}_s": v for k, v in used.items()}


def _simulate_served(
    args: argparse.Namespace,
    config: BatchConfig,
    setup: RouterSetup,
    fleet: Fleet,
    batch: Any,
    systems: list[System],
    rows: list[Record],
    tmp: str,
) -> list[Record]:
    """Profile the engines as served, simulate each Loom system on that profile beside its
    real makespan (`sim_makespan_s`, `sim_over_real`); the profile's rows as records."""
    calib = asyncio.run(calibrate(fleet.urls, args.max_running))
    served = Path(tmp) / "served_tp1.csv"
    write_served_profile(served, calib, fleet.profiles()[0])
    print("served profile (decode_batch, context, prefill, prefill_ctx, s):", calib)
    by = {s.name: s for s in systems}
    for row in rows:
        s = by[row["system"]]
        policies = s.policies
        if policies is None:
            row |= {"sim_makespan_s": None, "sim_over_real": None}
            continue
        row["sim_makespan_s"] = simulate(
            config, s.setup(setup), policies, batch, len(fleet.urls), served
        )
        row["sim_over_real"] = row["sim_makespan_s"] / row["makespan_s"]
        print(
            f"{row['system']:>16}: simulated {row['sim_makespan_s']:6.1f} s, real "
            f"(median) {row['makespan_s']:6.1f} s, sim/real {row['sim_over_real']:.3f}"
        )
    return profile_records(calib)


def parser(argv: list[str]) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--engine", nargs="*", default=None, help="running engines' URLs")
    ap.add_argument("--vllm", type=int, default=0, help="start this many vLLM CPU engines")
    ap.add_argument(
        "--simulate",
        action="store_true",
        help="with --engine: they are `loom serve engine`s; profile and simulate them too "
        "(always with --vllm)",
    )
    ap.add_argument("--standin", type=int, default=2, help="else this many stand-in engines")
    ap.add_argument("--kind", default="coding", choices=[k.value for k in WorkloadKind])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--token-scale", type=float, default=0.05)
    ap.add_argument("--tool-scale", type=float, default=0.05)
    ap.add_argument("--max-turn-tokens", type=int, default=256)
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--max-running", type=int, default=4, help="turns in flight per engine")
    ap.add_argument("--systems", default="heddle,verl,slime,verl*")
    ap.add_argument(
        "--engine-queue",
        type=int,
        default=0,
        help="Loom's engines' `queue`: turns sent beyond --max-running to wait in the engine",
    )
    ap.add_argument(
        "--history", type=int, default=3, help="earlier epochs the predictor learns from first"
    )
    ap.add_argument("--repeats", type=int, default=3, help="runs per system; medians reported")
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="run Loom's router in this process (a thread) rather than a process of its own",
    )
    ap.add_argument(
        "--cpu", action="store_true", help="report CPU seconds by process class for each run"
    )
    ap.add_argument("--json", default=None, metavar="PATH", help="write the results here")
    ap.add_argument(
        "--router-set",
        type=router_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of Loom's router for every Loom system (repeatable; an ablation, "
        "e.g. refit_every=100000 or max_preemptions=0); the simulation of a system sees the "
        "settings its router's policies read (placement parameters), not the driver's",
    )
    emu = ap.add_argument_group("paper scale on emulated GPUs")
    emu.add_argument("--emulate", default=None, help="MODEL@GPU[:tpN], e.g. qwen3-14b@h100:tp2")
    emu.add_argument("--engines", type=int, default=8, help="emulated engines")
    emu.add_argument(
        "--layouts",
        default=None,
        help="run each workload on each of these fleets in turn: NxD (N engines of degree D, "
        "e.g. 16x1,8x2,4x4,2x8) or planned (Heddle's layout for the workload's history, "
        "checked in the simulator); the degree of --emulate is then ignored",
    )
    emu.add_argument("--gpus", type=int, default=16, help="GPUs a planned layout may use")
    emu.add_argument("--time-scale", type=float, default=0.2, help="wall s per GPU s")
    emu.add_argument("--kinds", default="coding,search,math", help="workloads, in turn")
    emu.add_argument(
        "--engine-max-running", type=int, default=1024, help="each engine's own max_num_seqs"
    )
    emu.add_argument(
        "--stream-interval-ms", type=float, default=250.0, help="wall ms between stream chunks"
    )
    ap.add_argument(
        "--peers",
        default=None,
        help="sglang-router policies over the same engines ('' for none; default: "
        f"{ALL_PEERS}, none over stand-ins, which have no vocabulary for its text route)",
    )
    if "--emulate" in argv:  # paper scale: Heddle's batch unscaled
        ap.set_defaults(
            prompts=32, samples=16, token_scale=1.0, tool_scale=1.0, max_turn_tokens=10**9,
            max_turns=48, max_running=1024,
        )  # fmt: skip
    return ap


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = parser(argv)
    args = ap.parse_args(argv)
    standins = not (args.emulate or args.engine or args.vllm)  # what _fleet starts
    if args.peers is None:
        args.peers = "" if standins else ALL_PEERS
    elif args.peers and standins:
        ap.error(
            "--peers needs engines with a vocabulary (vLLM or --emulate): sglang-router's text "
            "route cannot reach stand-in engines; give --peers ''"
        )
    records = main_emulated(args) if args.emulate else main_real(args)
    if args.json:
        doc = results("bench_rollout_runtime", records, seed=args.seed)
        print(f"wrote {len(records)} records to {write_results(args.json, doc)}")


if __name__ == "__main__":
    main()
