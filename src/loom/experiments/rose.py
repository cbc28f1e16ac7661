"""ROSE's evaluation (§6, App. A–E) as runs of registered policies on the co-serving simulator.

Every system sees the same seeded trajectories per step and the same seeded serving day. The
RL step loop (`loom.experiments.rose_steps`) is one-step off-policy (§6): the rollout of step
s starts when the rollout of step s−1 has ended and the weights of step s−2 are trained; a
lent instance serves the rollout only once those weights have crossed to it (Fig. 10's sparse
transfer), while dedicated workers start at once. AReaL streams: a fixed number of
trajectories stay alive and training takes each batch as it completes. Throughput is the
trained sequences' tokens per step over the time between step ends (§6, "Metrics").

Baselines as the paper defines them: ROLL (the job's own GPUs; each environment pinned to one
inference worker — ROLL's agentic scheduler keeps an environment on its worker), AReaL (fully
asynchronous on the same GPUs); variants of ROSE for the ablations (static partition, no
prefix cache, TTFT-only / TPOT-only / no admission, pinned or turn-wise routing, lease times,
serving density, fewer lent GPUs).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from loom.core.trajectory import TrajectorySpec
from loom.experiments.report import Record, Task, bar_plot, by_experiment, line_plot
from loom.experiments.rose_steps import (
    ROLL,
    ROSE,
    Algo,
    RoseSystem,
    StepOut,
    TrainRun,
    _serving_day,
    _simulation,
    _wl,
    serving_alone,
    train,
    training_steps,
)
from loom.rollout.rose.admission import AdmissionKind
from loom.rollout.rose.scheduler import ROSE_ROUTERS, RoutingKind
from loom.sim.workloads.rose import (
    RoseWorkload,
)

__all__ = ["Algo", "RoseSystem", "TrainRun", "plot", "run_experiments", "summary", "train"]

# ---- experiments --------------------------------------------------------------------------
PAPER = {  # the paper's headline figures, beside ours in `summary`
    ("fig7", "8b", "grpo"): 1.31,
    ("fig7", "32b", "grpo"): 1.46,
    ("fig7", "8b", "dapo"): 1.42,
    ("fig7", "32b", "dapo"): 3.31,
    ("fig7", "8b", "areal"): 1.44,
    ("fig7", "32b", "areal"): 2.69,
    ("fig14", "8b", 4): 1.26,
    ("fig14", "8b", 8): 1.45,
    ("fig14", "8b", 16): 1.69,
    ("table3", "8b", "turn_wise"): 1.11,
    ("table3", "32b", "turn_wise"): 1.08,
    ("table3", "8b", "rose"): 1.16,
    ("table3", "32b", "rose"): 1.48,
}


@dataclass(frozen=True, kw_only=True)
class RoseScale:
    """Steps per run: the paper trains 25-100 steps; the simulator averages fewer."""

    steps: int
    dapo_steps: int  # DAPO's steps each run several rollouts' worth
    analysis_steps: int  # §6.2-6.4 and the appendices run five steps
    models: tuple[str, ...] = ("8b", "32b")

    @classmethod
    def for_run(cls, quick: bool) -> RoseScale:
        if quick:
            return cls(steps=3, dapo_steps=2, analysis_steps=2)
        return cls(steps=10, dapo_steps=6, analysis_steps=5)


def _serving_records(run: TrainRun, wl: RoseWorkload) -> Record:
    ttft, tpot = run.serving()
    out: Record = {"serving_requests": len(ttft)}
    for name, xs, slo in (("ttft", ttft, wl.slo_ttft_s), ("tpot", tpot, wl.slo_tpot_s)):
        if len(xs):
            out[f"{name}_p95_ms"] = float(np.percentile(xs, 95) * 1e3)
            out[f"{name}_p99_ms"] = float(np.percentile(xs, 99) * 1e3)
            out[f"{name}_over_slo"] = float(np.mean(xs > slo))
            out[f"{name}_violations"] = int(np.sum(xs > slo))
            out[f"{name}_slo_met"] = bool(np.percentile(xs, 99) <= slo)
    # NOTE: a request's TTFT is measured at its prefiller and its TPOT at its decoder; a
    # request over both SLOs counts twice here.
    out["slo_violations"] = out.get("ttft_violations", 0) + out.get("tpot_violations", 0)
    results = [s.result for s in run.steps]
    out["stalls"] = sum(r.stalls for r in results)
    out["aborts"] = sum(r.aborts for r in results)
    out["cuts"] = sum(r.cuts for r in results)
    return out


def _row(experiment: str, key: str, run: TrainRun, **extra: object) -> Record:
    wl = _wl(key)
    return {
        "experiment": experiment,
        "model": wl.model,
        "policy": run.system,
        "algo": run.algo.value,
        "steps": len(run.steps),
        "throughput_tok_s": run.mean_throughput(),
        "rollout_time_s": float(np.mean([s.rollout_s for s in run.steps])),
        "step_time_s": float(np.mean(run.step_times)),
        **extra,
    }


def fig7_tasks(scale: RoseScale, seed: int) -> Iterator[Task]:
    """Fig. 7a-c: ROSE against ROLL-GRPO, ROLL-DAPO and AReaL."""
    for key in scale.models:
        for algo, base in (
            (Algo.GRPO, "roll_grpo"),
            (Algo.DAPO, "roll_dapo"),
            (Algo.AREAL, "areal"),
        ):

            def thunk(key: str = key, algo: Algo = algo, base: str = base) -> list[Record]:
                wl = _wl(key)
                steps = scale.dapo_steps if algo == Algo.DAPO else scale.steps
                rose = train(wl, ROSE, Algo.GRPO if algo == Algo.AREAL else algo, steps, seed)
                other = train(wl, replace(ROLL, name=base), algo, steps, seed)
                ratio = rose.mean_throughput() / other.mean_throughput()
                rows = []
                for run in (rose, other):
                    rows.append(
                        _row("fig7", key, run, baseline=base, speedup=ratio if run is rose else 1.0)
                    )
                rows[0]["paper_speedup"] = PAPER[("fig7", key, algo.value)]
                return rows

            yield f"fig7 {key} {algo.value}", thunk


FIG8_PAPER = {  # §6.1: rollout speedup over ROLL; preempted GPU time (Fig. 8b)
    ("8b", "lambda_rl"): (1.31, 0.261),
    ("32b", "lambda_rl"): (1.23, 0.261),
    ("8b", "rlboost_plus"): (1.41, 0.068),
    ("32b", "rlboost_plus"): (1.48, 0.073),
    ("8b", "rose"): (1.41 * 1.20, 0.005),
    ("32b", "rose"): (1.48 * 1.26, 0.005),
}


def fig8_tasks(scale: RoseScale, seed: int) -> Iterator[Task]:
    """Fig. 8: rollout time and preempted GPU time of ROLL, λRL, RLBoost+ and ROSE (GRPO),
    over the volatile spot window."""
    systems = (
        replace(ROLL, name="roll"),
        replace(ROLL, name="lambda_rl", elastic="serverless"),
        replace(ROLL, name="rlboost_plus", elastic="spot"),
        ROSE,
    )
    for key in scale.models:

        def thunk(key: str = key) -> list[Record]:
            wl = _wl(key)
            runs = [train(wl, system, Algo.GRPO, scale.steps, seed) for system in systems]
            base = float(np.mean([s.rollout_s for s in runs[0].steps]))
            rows = []
            for run in runs:
                t = float(np.mean([s.rollout_s for s in run.steps]))
                paper = FIG8_PAPER.get((key, run.system), (1.0, 0.0))
                rows.append(
                    _row(
                        "fig8",
                        key,
                        run,
                        speedup=base / t,
                        paper_speedup=paper[0],
                        preempted_gpu_frac=run.preempted_gpu_s / run.gpu_s,
                        paper_preempted_gpu_frac=paper[1],
                    )
                )
            return rows

        yield f"fig8 {key}", thunk


FIG14_TIMELINE_S = 5.0  # the first step's timeline, a point every 5 s of simulated time
FIG14_SERIES = (
    "trajectories alive",
    "turns in the central queue",
    "turns on dedicated GPUs",
    "turns on lent GPUs",
)


def longest_alone_s(wl: RoseWorkload, specs: Sequence[TrajectorySpec]) -> float:
    """The step's slowest trajectory run alone on one dedicated rollout worker (its turns, its
    tool calls, nothing batched beside it): no placement over any number of GPUs ends the step
    sooner."""
    route = ROSE_ROUTERS.get(RoutingKind.ROSE)
    dedicated = [wl.rollout_tp]
    return max(
        _simulation(wl, [s], router=route(), dedicated_tp=dedicated).run().makespan_s for s in specs
    )


def fig14_tasks(scale: RoseScale, seed: int) -> Iterator[Task]:
    """App. E / Fig. 14: rollout time of Qwen3-8B with 0, 4, 8 and 16 lent GPUs; beside it
    the most any lent GPUs could give (the steps' slowest trajectories alone), and the first
    step's timeline with none and with 16."""

    def thunk() -> list[Record]:
        wl = _wl("8b")
        seeded = replace(wl, seed=seed)
        steps = training_steps(seeded, Algo.GRPO, scale.analysis_steps)
        alone = float(np.mean([longest_alone_s(seeded, seeded.sample(at)) for at in steps]))
        base = None
        rows: list[Record] = []
        for n in (0, 4, 8, 16):
            run = train(
                wl,
                replace(ROSE, name=f"rose+{n}", lent_gpus=n),
                Algo.GRPO,
                scale.analysis_steps,
                seed,
                timeline_s=FIG14_TIMELINE_S if n in (0, 16) else None,
            )
            t = float(np.mean([s.rollout_s for s in run.steps]))
            base = base or t
            rows.append(
                _row(
                    "fig14",
                    "8b",
                    run,
                    lent_gpus=n,
                    speedup=base / t,
                    paper_speedup=PAPER.get(("fig14", "8b", n), 1.0),
                    longest_alone_s=alone,
                    speedup_bound=base / alone,
                )
            )
            rows += [
                {
                    "experiment": "fig14_timeline",
                    "model": wl.model,
                    "lent_gpus": n,
                    "panel": f"{n} lent GPUs",
                    "t_s": point[0],
                    "series": name,
                    "count": count,
                }
                for point in run.steps[0].result.timeline
                for name, count in zip(FIG14_SERIES, point[1:], strict=True)
            ]
        return rows

    yield "fig14", thunk


def table3_tasks(scale: RoseScale, seed: int) -> Iterator[Task]:
    """Table 3: pinned trajectories, then turn-wise routing, then KV-cache affinity."""
    for key in scale.models:

        def thunk(key: str = key) -> list[Record]:
            wl = _wl(key)
            rows, base = [], None
            for kind in (RoutingKind.PIN, RoutingKind.TURN_WISE, RoutingKind.ROSE):
                system = replace(ROSE, name=kind.value, routing=kind)
                run = train(wl, system, Algo.GRPO, scale.analysis_steps, seed)
                t = float(np.mean([s.rollout_s for s in run.steps]))
                base = base or t
                rows.append(
                    _row(
                        "table3",
                        key,
                        run,
                        speedup=base / t,
                        paper_speedup=PAPER.get(("table3", key, kind.value), 1.0),
                    )
                )
            return rows

        yield f"table3 {key}", thunk


PAPER_COSERVE_KEYS = ("paper_rollout_time_s", "paper_ttft_p99_ms", "paper_tpot_p99_ms")
# The paper's rollout time (s), P99 TTFT (ms) and P99 TPOT (ms) per (experiment, model, variant),
# as its Tables 2 (§6.2), 4 (App. C) and 5 (App. D) state them
COSERVE_PAPER: dict[tuple[str, str, str], tuple[float, float, float]] = {
    ("table2", "8b", "static_partition"): (776.7, 330.95, 1488.2),
    ("table2", "8b", "+memory_preemption"): (591.7, 517.9, 162.8),
    ("table2", "8b", "+prefix_caching"): (469.3, 333.6, 186.3),
    ("table2", "32b", "static_partition"): (1310.5, 603.0, 7021.1),
    ("table2", "32b", "+memory_preemption"): (959.7, 651.3, 503.8),
    ("table2", "32b", "+prefix_caching"): (920.4, 640.6, 483.2),
    ("table4", "8b", "lease_10s"): (496.3, 338.11, 136.13),
    ("table4", "8b", "lease_20s"): (497.1, 334.71, 135.28),
    ("table4", "8b", "lease_50s"): (492.2, 371.10, 140.70),
    ("table4", "8b", "lease_100s"): (502.1, 491.90, 148.10),
    ("table5", "8b", "density_1"): (496.3, 338.1, 136.1),
    ("table5", "8b", "density_1.5"): (511.7, 380.2, 149.0),
    ("table5", "8b", "density_2"): (569.9, 459.1, 150.1),
    ("table5", "32b", "density_1"): (960.1, 837.5, 398.1),
    ("table5", "32b", "density_1.5"): (977.7, 870.2, 421.3),
    ("table5", "32b", "density_2"): (989.9, 899.1, 441.2),
}


def _coserve_tasks(
    experiment: str,
    scale: RoseScale,
    seed: int,
    variants: Sequence[tuple[str, RoseSystem]],
    suffix: str = "",
    **tags: object,
) -> Iterator[Task]:
    for key in scale.models:

        def thunk(key: str = key) -> list[Record]:
            wl = _wl(key)
            rows = []
            for label, system in variants:
                run = train(wl, replace(system, name=label), Algo.GRPO, scale.analysis_steps, seed)
                rows.append(_row(experiment, key, run, **_serving_records(run, wl), **tags))
                paper = COSERVE_PAPER.get((experiment, key, label))
                if paper is not None:
                    rows[-1].update(zip(PAPER_COSERVE_KEYS, paper, strict=True))
                for k, v in _variant_fields(system).items():
                    rows[-1].setdefault(k, v)
            return rows

        yield f"{experiment} {key}{suffix}", thunk


# Table 1 (§6.2): rollout time (s) and the P99 serving latency (ms) of each method
TABLE1_PAPER = {
    ("8b", "rose"): (496.3, 338.1),
    ("8b", "serverlessllm"): (651.7, 1166.1),
    ("8b", "prism"): (731.7, 973.2),
    ("8b", "serving_alone"): (None, 314.8),
    ("32b", "rose"): (960.1, 837.5),
    ("32b", "serverlessllm"): (1161.8, 2426.2),
    ("32b", "prism"): (1301.2, 1625.4),
    ("32b", "serving_alone"): (None, 716.1),
}


def table1_tasks(scale: RoseScale, seed: int) -> Iterator[Task]:
    """Table 1: rollout time and serving P99 of ROSE, ServerlessLLM (swapping the models) and
    Prism, beside the lent GPUs serving alone (ServerlessLLM without rollouts); each rollout
    time also over ROSE's, as the paper's text compares them."""
    for label, thunk in _coserve_tasks("table1", scale, seed, TABLE1):

        def with_alone(label: str = label, thunk=thunk) -> list[Record]:  # type: ignore[no-untyped-def]
            rows = thunk()
            key = label.split()[1]
            wl = _wl(key)
            rose_s = next(r["rollout_time_s"] for r in rows if r["policy"] == "rose")
            for r in rows:
                paper_s, paper_p99 = TABLE1_PAPER.get((key, r["policy"]), (None, None))
                r["paper_rollout_time_s"], r["paper_p99_ms"] = paper_s, paper_p99
                r["rollout_vs_rose"] = r["rollout_time_s"] / rose_s
                rose_paper = TABLE1_PAPER[(key, "rose")][0]
                r["paper_rollout_vs_rose"] = (
                    paper_s / rose_paper if paper_s and rose_paper else None
                )
            day = _serving_day(wl, ROSE, seed)
            assert day is not None
            res = serving_alone(wl, wl.max_lent_gpus, day)
            run = TrainRun(system="serving_alone", algo=Algo.GRPO)
            run.steps.append(StepOut(0, 0.0, 1.0, 0, res))
            row = {"experiment": "table1", "model": wl.model, "policy": "serving_alone"}
            paper_p99 = TABLE1_PAPER[(key, "serving_alone")][1]
            rows.append({**row, **_serving_records(run, wl), "paper_p99_ms": paper_p99})
            return rows

        yield label, with_alone


def _variant_fields(system: RoseSystem) -> Record:
    return {
        "admission": system.admission.value,
        "lease_s": system.lease_s,
        "density": system.density,
        "preemptive": system.preemptive,
        "prefix_cache": system.prefix_cache,
    }


TABLE2 = (
    ("static_partition", replace(ROSE, preemptive=False, prefix_cache=False)),
    ("+memory_preemption", replace(ROSE, prefix_cache=False)),
    ("+prefix_caching", ROSE),
)
FIG9 = tuple(
    (kind.value, replace(ROSE, admission=kind))
    for kind in (
        AdmissionKind.DUAL_SLO,
        AdmissionKind.TTFT_ONLY,
        AdmissionKind.TPOT_ONLY,
        AdmissionKind.NONE,
    )
)
# Fig. 9 again under three times the serving density, where ROSE's admission still holds
# every request within its SLO and no admission does not (the serving load of Fig. 3b leaves
# both within it: see the README).
STRESS_DENSITY = 3.0
FIG9_STRESS = tuple(
    (f"{label}@x{STRESS_DENSITY:g}", replace(system, density=STRESS_DENSITY))
    for label, system in FIG9
    if label in ("dual_slo", "none")
)
TABLE4 = tuple((f"lease_{int(x)}s", replace(ROSE, lease_s=x)) for x in (10.0, 20.0, 50.0, 100.0))
TABLE5 = tuple((f"density_{x:g}", replace(ROSE, density=x)) for x in (1.0, 1.5, 2.0))
# Table 1's GPU-multiplexing baseline (Prism, §6.1): co-scheduled without dual-SLO admission
# and without a rollout prefix cache. NOTE: Prism schedules the rollout at 4x the serving SLO;
# without its scheduler, no admission at all is the nearest registered policy.
TABLE1 = (
    ("rose", ROSE),
    # §6.2: ServerlessLLM in place of the co-serving executor (bidirectional autoscaling)
    ("serverlessllm", replace(ROSE, swap=True, admission=AdmissionKind.NONE)),
    # its keep-alive is not given: also scaled down the moment serving idles
    (
        "serverlessllm@keepalive0",
        replace(ROSE, swap=True, admission=AdmissionKind.NONE, keep_alive_s=0.0),
    ),
    ("prism", replace(ROSE, admission=AdmissionKind.NONE, prefix_cache=False)),
)


def fig12_tasks(seed: int) -> Iterator[Task]:
    """App. A / Fig. 12: rollout throughput of one Qwen3-8B GPU against its running cap."""

    def thunk() -> list[Record]:
        wl = _wl("8b")
        specs = wl.sample(0, n_groups=8)
        rows = []
        for cap in (1, 2, 4, 8, 16, 32, 64):
            res = _simulation(
                wl,
                specs,
                router=ROSE_ROUTERS.get(RoutingKind.ROSE)(cap_per_gpu=cap),
                dedicated_tp=[1],
                cap_per_gpu=cap,
            ).run()
            rows.append(
                {
                    "experiment": "fig12",
                    "model": wl.model,
                    "policy": "dedicated",
                    "per_gpu_batch": cap,
                    "throughput_tok_s": (res.output_tokens + res.prefill_tokens) / res.makespan_s,
                    "output_tok_s": res.output_tokens / res.makespan_s,
                    "rollout_time_s": res.makespan_s,
                }
            )
        return rows

    yield "fig12", thunk


def run_experiments(seed: int, quick: bool) -> tuple[int, Iterator[Task]]:
    scale = RoseScale.for_run(quick)
    from loom.experiments.rose_transfer import fig10_records

    groups: list[list[Task]] = [
        list(fig7_tasks(scale, seed)),
        list(fig8_tasks(scale, seed)),
        list(fig14_tasks(scale, seed)),
        list(table3_tasks(scale, seed)),
        list(table1_tasks(scale, seed)),
        list(_coserve_tasks("table2", scale, seed, TABLE2)),
        list(_coserve_tasks("fig9", scale, seed, FIG9)),
        list(
            _coserve_tasks("fig9", replace(scale, models=("32b",)), seed, FIG9_STRESS, suffix=" x3")
        ),
        list(_coserve_tasks("table4", replace(scale, models=("8b",)), seed, TABLE4)),
        list(_coserve_tasks("table5", scale, seed, TABLE5)),
        list(fig12_tasks(seed)),
        [("fig10", lambda: fig10_records(seed, quick))],
    ]
    tasks = [t for g in groups for t in g]
    return len(tasks), iter(tasks)


ROLLOUT_S, TTFT, TPOT = "rollout time (s)", "P99 TTFT (ms)", "P99 TPOT (ms)"
# One bar chart each: experiment, file, x, hue, metric, the paper's (None: it states none),
# y label, title. The paper's values come from the records (PAPER, FIG8_PAPER, TABLE1_PAPER,
# COSERVE_PAPER and rose_transfer's tables), each cited where it is defined.
BARS: tuple[tuple[str, str, str, str, str, str | None, str, str], ...] = (
    (
        "fig7",
        "fig7",
        "baseline",
        "policy",
        "throughput_tok_s",
        None,
        "throughput (tokens/s)",
        "Fig. 7: throughput",
    ),
    (
        "fig7",
        "fig7_speedup",
        "baseline",
        "policy",
        "speedup",
        "paper_speedup",
        "ROSE's speedup (×)",
        "Fig. 7: ROSE's speedup",
    ),
    ("fig8", "fig8", "policy", "model", "rollout_time_s", None, ROLLOUT_S, "Fig. 8a: rollout time"),
    (
        "fig8",
        "fig8_speedup",
        "policy",
        "model",
        "speedup",
        "paper_speedup",
        "rollout speedup over ROLL (×)",
        "Fig. 8a: speedup over ROLL",
    ),
    (
        "fig8",
        "fig8b",
        "policy",
        "model",
        "preempted_gpu_frac",
        "paper_preempted_gpu_frac",
        "preempted GPU time (fraction)",
        "Fig. 8b: allocation overhead",
    ),
    ("fig9", "fig9", "policy", "model", "tpot_p99_ms", None, TPOT, "Fig. 9: serving TPOT P99"),
    (
        "table1",
        "table1",
        "policy",
        "model",
        "rollout_time_s",
        "paper_rollout_time_s",
        ROLLOUT_S,
        "Table 1: rollout time",
    ),
    (
        "table1",
        "table1_ttft",
        "policy",
        "model",
        "ttft_p99_ms",
        "paper_p99_ms",
        TTFT,
        "Table 1: serving TTFT P99",
    ),
    (
        "table2",
        "table2",
        "policy",
        "model",
        "rollout_time_s",
        "paper_rollout_time_s",
        ROLLOUT_S,
        "Table 2: rollout time",
    ),
    (
        "table2",
        "table2_tpot",
        "policy",
        "model",
        "tpot_p99_ms",
        "paper_tpot_p99_ms",
        TPOT,
        "Table 2: serving TPOT P99",
    ),
    (
        "table3",
        "table3",
        "policy",
        "model",
        "speedup",
        "paper_speedup",
        "rollout speedup over pinned (×)",
        "Table 3: routing",
    ),
    (
        "table4",
        "table4",
        "policy",
        "model",
        "ttft_p99_ms",
        "paper_ttft_p99_ms",
        TTFT,
        "Table 4: serving TTFT P99 by lease",
    ),
    (
        "table5",
        "table5",
        "policy",
        "model",
        "ttft_p99_ms",
        "paper_ttft_p99_ms",
        TTFT,
        "Table 5: serving TTFT P99",
    ),
    (
        "table5",
        "table5_rollout",
        "policy",
        "model",
        "rollout_time_s",
        "paper_rollout_time_s",
        ROLLOUT_S,
        "Table 5: rollout time",
    ),
    (
        "fig10",
        "fig10",
        "policy",
        "model",
        "transfer_s",
        "paper_transfer_s",
        "weight transfer time (s)",
        "Fig. 10a: weight transfer",
    ),
)
# One line chart each: experiment, file, x, x label, metric, y label, hue, the paper's, title
LINES: tuple[tuple[str, str, str, str, str, str, str, str | None, str], ...] = (
    (
        "fig10b",
        "fig10b",
        "bandwidth_gbps",
        "bandwidth (Gbps)",
        "transfer_s",
        "weight transfer time (s)",
        "policy",
        "paper_transfer_s",
        "Fig. 10b: transfer vs bandwidth",
    ),
    (
        "fig12",
        "fig12",
        "per_gpu_batch",
        "per-GPU batch (requests)",
        "throughput_tok_s",
        "throughput (tokens/s)",
        "policy",
        None,
        "Fig. 12: per-GPU batch",
    ),
    (
        "fig14",
        "fig14",
        "lent_gpus",
        "lent serving GPUs (GPUs)",
        "rollout_time_s",
        ROLLOUT_S,
        "algo",
        None,
        "Fig. 14: rollout time vs lent GPUs",
    ),
    (
        "fig14",
        "fig14_speedup",
        "lent_gpus",
        "lent serving GPUs (GPUs)",
        "speedup",
        "speedup over no lent GPUs (×)",
        "algo",
        "paper_speedup",
        "Fig. 14: speedup vs lent GPUs",
    ),
)


def plot(records: list[Record], out: Path) -> list[Path]:
    """Fig. 7, 8, 9, 10, 12, 14 and Tables 1-5 as PNG charts under `out`, the paper's values
    as black markers (bars) or dashed lines (lines) wherever it states them."""
    by = by_experiment(records)
    paths = []
    for exp, stem, x, hue, metric, paper, ylabel, title in BARS:
        if exp in by:
            paths.append(
                bar_plot(
                    by[exp],
                    x=x,
                    hue=hue,
                    metric=metric,
                    paper=paper,
                    ylabel=ylabel,
                    facet="model",
                    path=out / f"{stem}.png",
                    title=title,
                )
            )
    if "fig14_timeline" in by:
        paths.append(
            line_plot(
                by["fig14_timeline"],
                x="t_s",
                metric="count",
                hue="series",
                facet="panel",
                xlabel="time into the step (s)",
                ylabel="trajectories, turns",
                path=out / "fig14_timeline.png",
                title="Fig. 14: the first 8B step with no lent GPUs and with 16",
            )
        )
    for exp, stem, x, xlabel, metric, ylabel, hue, paper, title in LINES:
        if exp in by:
            paths.append(
                line_plot(
                    by[exp],
                    x=x,
                    metric=metric,
                    hue=hue,
                    facet="model",
                    paper=paper,
                    xlabel=xlabel,
                    ylabel=ylabel,
                    path=out / f"{stem}.png",
                    title=title,
                )
            )
    return paths


def summary(records: list[Record]) -> list[Record]:
    """Ours beside the paper's: speedups of Fig. 7, Fig. 14, Table 3 and Fig. 10, Table 1's
    rollout times over ROSE's; whether
    ROSE met the serving SLOs and `none` did not."""
    rows: list[Record] = []
    for r in records:
        if r.get("paper_speedup") is not None and r["experiment"] in ("fig7", "fig14", "table3"):
            if r["experiment"] == "fig7" and r["policy"] != "rose":
                continue
            rows.append(
                {
                    "experiment": "summary",
                    "of": r["experiment"],
                    "model": r["model"],
                    "policy": r["policy"],
                    "variant": r.get("baseline")
                    if r["experiment"] == "fig7"
                    else r.get("lent_gpus", r["policy"]),
                    "speedup": r["speedup"],
                    "paper": r["paper_speedup"],
                    "within_15pct": abs(r["speedup"] / r["paper_speedup"] - 1) <= 0.15,
                }
            )
    for r in records:
        if r["experiment"] == "table1" and r.get("paper_rollout_vs_rose") and r["policy"] != "rose":
            rows.append(
                {
                    "experiment": "summary",
                    "of": "table1",
                    "model": r["model"],
                    "policy": r["policy"],
                    "variant": "rollout time over ROSE's",
                    "speedup": r["rollout_vs_rose"],
                    "paper": r["paper_rollout_vs_rose"],
                    "within_15pct": abs(r["rollout_vs_rose"] / r["paper_rollout_vs_rose"] - 1)
                    <= 0.15,
                }
            )
    for r in records:
        if r["experiment"] == "fig10" and r.get("paper_speedup"):
            rows.append(
                {
                    "experiment": "summary",
                    "of": "fig10",
                    "model": r["model"],
                    "policy": r["policy"],
                    "variant": r["policy"],
                    "speedup": r["speedup_vs_batch"],
                    "paper": r["paper_speedup"],
                    "within_15pct": abs(r["speedup_vs_batch"] / r["paper_speedup"] - 1) <= 0.15,
                }
            )
    for r in records:
        if r["experiment"] == "fig9" and r["policy"].split("@")[0] in ("dual_slo", "none"):
            rows.append(
                {
                    "experiment": "summary",
                    "of": "fig9",
                    "model": r["model"],
                    "policy": r["policy"],
                    "variant": f"density {r['density']:g}: requests over SLO",
                    "speedup": float(r.get("ttft_violations", 0) + r.get("tpot_violations", 0)),
                    "paper": 0.0 if r["policy"].startswith("dual_slo") else None,
                    "within_15pct": None,
                }
            )
    return rows
