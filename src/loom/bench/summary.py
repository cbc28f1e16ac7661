"""A benchmark's runs as tidy records: one per run (`record: "run"`), one per system and
workload summarizing its runs (`record: "system"`: medians, the runs, their spread, the ratio
to Heddle's makespan), and the targets' ratios (best baseline and best peer over Heddle)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from loom.bench.systems import BASELINES, PEERS

__all__ = [
    "SIM_FIELDS",
    "across_fleets",
    "per_turn",
    "print_across",
    "profile_records",
    "run_record",
    "simulated",
    "system_record",
    "targets",
    "with_vs_heddle",
]

Record = dict[str, Any]
_TIMING = ("queue_s", "first_token_s", "decode_s")
# the simulator's figures beside a system's makespan on emulated GPUs (None for a peer)
SIM_FIELDS = (
    "sim_s",
    "real_over_sim",
    "sim_decision_s",
    "sim_routed_s",
    "real_over_sim_routed",
    "sim_preemptions",
    "sim_prefill_tokens",
    "sim_cache_hit_tokens",
    "sim_migrations",
)


class Simulated(Protocol):
    """What a simulated run reports (`loom.sim.rollout.simulator.RolloutResult`)."""

    makespan_s: float
    preemptions: int
    prefill_tokens: int
    cache_hit_tokens: int
    migrations: int


def per_turn(timing: dict[str, float] | None) -> dict[str, float | None]:
    """The router's timing of a run (`/v1/stats`) per turn: waiting in the router
    (`queue_s_per_turn`), to the first token, decoding; None for a peer router."""
    if timing is None:
        return {f"{k}_per_turn": None for k in _TIMING}
    n = max(1, timing["turns"])
    return {f"{k}_per_turn": timing[k] / n for k in _TIMING}


def run_record(row: dict[str, Any], *, workload: str, repeat: int, turns: int) -> Record:
    """One run (`loom.bench.systems.System.run`) as a flat record: its outcome, the router's
    CPU (None where it ran in this process, counted with the agents'), per turn and as a
    share of the run's CPU (router, engines and agents), the router's timing per turn, and
    how far the engines' counters moved (`engine_<counter>`)."""
    router = row.get("router_cpu_s")
    total = (router or 0.0) + row["engines_cpu_s"] + row["agents_cpu_s"]
    return {
        "record": "run",
        "workload": workload,
        "system": row["system"],
        "repeat": repeat,
        "turns": turns,
        "makespan_s": row["makespan_s"],
        "wall_s": row["wall_s"],
        "tokens": row["tokens"],
        "throughput_tok_s": row["throughput_tok_s"],
        "preemptions": row["preemptions"],
        "migrations": row["migrations"],
        "router_cpu_s": router,
        "router_cpu_ms_per_turn": None if router is None else 1e3 * router / max(1, turns),
        "router_cpu_share": None if router is None else router / max(total, 1e-9),
        "engines_cpu_s": row["engines_cpu_s"],
        "agents_cpu_s": row["agents_cpu_s"],
        "run_cpu_s": total,
        **per_turn(row["timing"]),
        **{f"engine_{k}": v for k, v in row["engine"].items()},
    }


def _median(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def system_record(runs: Sequence[Record]) -> Record:
    """A system's runs of one workload (run records) summarized: medians, the makespans of
    every run, and their spread ((max - min) / median)."""
    if not runs:
        raise ValueError("a system's summary needs at least one run")
    spans = [r["makespan_s"] for r in runs]
    median = statistics.median(spans)
    return {
        "record": "system",
        "workload": runs[0]["workload"],
        "system": runs[0]["system"],
        "runs": len(runs),
        "makespan_s": median,
        "makespan_runs_s": spans,
        "spread": (max(spans) - min(spans)) / median,
        "throughput_tok_s": statistics.median(r["throughput_tok_s"] for r in runs),
        "preemptions": statistics.median(r["preemptions"] for r in runs),
        "migrations": statistics.median(r["migrations"] for r in runs),
        "router_cpu_ms_per_turn": _median(r["router_cpu_ms_per_turn"] for r in runs),
        "router_cpu_share": _median(r["router_cpu_share"] for r in runs),
        "run_cpu_s": statistics.median(r["run_cpu_s"] for r in runs),
        "wall_s": statistics.median(r["wall_s"] for r in runs),
    }


def with_vs_heddle(records: Sequence[Record]) -> list[Record]:
    """System records with `vs_heddle`: makespan over Heddle's (above 1: slower than Heddle;
    None without a Heddle run)."""
    heddle = next((r["makespan_s"] for r in records if r["system"] == "heddle"), None)
    return [
        {**r, "vs_heddle": None if heddle is None else r["makespan_s"] / heddle} for r in records
    ]


def targets(records: Sequence[Record]) -> dict[str, float | None]:
    """Of one workload's system records: the best of verl, slime and verl* over Heddle's
    makespan (target >= 1.2), and the best sglang-router policy's (target >= 1.3); None where
    either side did not run."""
    by = {r["system"]: r["makespan_s"] for r in records}
    heddle = by.get("heddle")
    base = [by[s] for s in BASELINES if s in by]
    peer = [by[s] for s in PEERS if s in by]
    return {
        "best_baseline_over_heddle": min(base) / heddle if heddle and base else None,
        "best_peer_over_heddle": min(peer) / heddle if heddle and peer else None,
    }


def simulated(makespan_s: float, bare: Simulated, routed: Simulated, decision_s: float) -> Record:
    """A system's real median makespan beside the simulator's of the same batch: bare
    (`sim_s`, its counters) and with the served router modelled (`sim_routed_s`, its CPU per
    turn as `sim_decision_s`), and real over each."""
    return {
        "sim_s": bare.makespan_s,
        "real_over_sim": makespan_s / bare.makespan_s,
        "sim_decision_s": decision_s,
        "sim_routed_s": routed.makespan_s,
        "real_over_sim_routed": makespan_s / routed.makespan_s,
        "sim_preemptions": bare.preemptions,
        "sim_prefill_tokens": bare.prefill_tokens,
        "sim_cache_hit_tokens": bare.cache_hit_tokens,
        "sim_migrations": bare.migrations,
    }


def profile_records(rows: Iterable[Sequence[float]]) -> list[Record]:
    """Rows of a latency profile (`loom.bench.calibrate`) as records."""
    return [
        {
            "record": "profile",
            "decode_batch": b,
            "decode_context_tokens": c,
            "prefill_tokens": p,
            "prefill_context_tokens": pc,
            "time_s": t,
        }
        for b, c, p, pc, t in rows
    ]


def across_fleets(workload: str, records: Sequence[Record]) -> Record:
    """Of one workload's system records on several fleets (`fleet`: `NxD` uniform, or
    `planned`): Heddle on its planned fleet (else its best), the best peer and the best of
    verl/slime/verl* each on the uniform fleet that serves it best and on the planned one, and
    the ratios the targets name: best peer uniform / Heddle (>= 1.5), best peer on the planned
    fleet / Heddle (>= 1.2), best baseline uniform / Heddle (>= 1.3)."""
    rows = [r for r in records if r.get("record") == "system" and r["workload"] == workload]
    span: dict[tuple[str, str], float] = {(r["system"], r["fleet"]): r["makespan_s"] for r in rows}

    def best(names: Iterable[str], uniform: bool) -> tuple[str, str, float] | None:
        got = [
            (s, f, m) for (s, f), m in span.items() if s in names and (f != "planned") == uniform
        ]
        return min(got, key=lambda x: x[2]) if got else None

    heddle = span.get(("heddle", "planned")) or min(
        (m for (s, _), m in span.items() if s == "heddle"), default=None
    )
    out: Record = {"record": "fleets", "workload": workload, "heddle_s": heddle}
    for label, names, uniform in (
        ("peer_uniform", PEERS, True),
        ("peer_planned", PEERS, False),
        ("baseline_uniform", BASELINES, True),
        ("baseline_planned", BASELINES, False),
        ("heddle_uniform", ("heddle",), True),
    ):
        got = best(names, uniform)
        out[f"best_{label}"] = None if got is None else f"{got[0]} on {got[1]}"
        out[f"best_{label}_s"] = None if got is None else got[2]
        out[f"best_{label}_over_heddle"] = None if got is None or not heddle else got[2] / heddle
    return out


def print_across(rec: Record) -> None:
    """The comparison across fleets, one line each."""
    print(f"{rec['workload']} across fleets: heddle {rec['heddle_s'] or float('nan'):.1f} s")
    for label, target in (
        ("peer_uniform", 1.5),
        ("peer_planned", 1.2),
        ("baseline_uniform", 1.3),
        ("baseline_planned", None),
        ("heddle_uniform", None),
    ):
        ratio = rec[f"best_{label}_over_heddle"]
        if ratio is None:
            continue
        aim = f" (target >= {target})" if target else ""
        print(f"  best {label.replace('_', ' ')}: {rec[f'best_{label}']}, x{ratio:.3f}{aim}")
