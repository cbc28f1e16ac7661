"""RL job workloads for the cluster level: Table 6 profiles with Philly-shaped arrivals and
durations (§7.5), a loader for a Philly-derived trace, Table 3's micro-benchmark jobs, and
§7.4's production trace of Table 3 job types.

A job's Table 6 times are its worst case (every response at the maximum length); its actual
per-iteration times are drawn below them by `loom.cluster.params.NoiseModel`. Its duration
(solo, hours) sets the iteration count at its expected solo iteration time.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loom.cluster.colocation import rollout_speed
from loom.cluster.job import MuxJob
from loom.cluster.params import (
    NoiseModel,
    Philly,
    Testbed,
    footprint,
    job_types,
    noise_model,
    philly,
    production,
    profiles,
    switch_cost,
    testbed,
)
from loom.cluster.sync import topology_aware_sync_s
from loom.core.errors import ConfigError
from loom.core.rng import stream

__all__ = [
    "KINDS",
    "ArrivalTrace",
    "load_philly_csv",
    "micro_job",
    "production_jobs",
    "synthetic_philly",
    "table6_jobs",
]

KINDS = ("balanced", "rollout_heavy", "train_heavy", "mixed")
PARAMS_B = {"3b": 3.1, "7b": 7.6, "14b": 14.7, "32b": 32.5}  # bf16 weights for sync (models.toml)
# NOTE: Table 6 gives no model or response length; its sizes run Table 3's single-turn models
# with Table 3's 8K maximum response length (for the roofline of co-located rollouts).
SIZE_MODELS = {"7b": "qwen2.5-7b", "14b": "qwen2.5-14b", "32b": "qwen2.5-32b"}
SIM_MAX_LEN = 8192


@dataclass(frozen=True, kw_only=True)
class ArrivalTrace:
    """Arrival times and solo durations of jobs, in hours."""

    arrivals_h: tuple[float, ...]
    durations_h: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.arrivals_h) != len(self.durations_h):
            raise ConfigError("trace: one duration per arrival")


def synthetic_philly(
    seed: int, jobs: int | None = None, span_h: float | None = None
) -> ArrivalTrace:
    """Poisson arrivals over the span with lognormal durations of the Philly segment's mean,
    capped at its longest job (§7.5: 300 jobs, 580 h, mean 14.4 h, max 142.9 h)."""
    return _synthetic(philly(), seed, "philly", jobs, span_h)


def _synthetic(
    p: Philly, seed: int, name: str, jobs: int | None, span_h: float | None
) -> ArrivalTrace:
    """`jobs` arrivals (fewer than the trace's: over a proportionally shorter span, keeping the
    arrival rate) with heavy-tailed durations of the trace's mean."""
    n = jobs or p.jobs
    span = span_h if span_h is not None else p.span_h * n / p.jobs
    rng = stream(seed, name)
    arrivals = np.sort(rng.uniform(0.0, span, size=n))
    sigma = 1.4  # NOTE: heavy-tailed like Philly's durations; mu keeps the segment's mean
    mu = np.log(p.mean_duration_h) - sigma**2 / 2
    durations = np.minimum(rng.lognormal(mu, sigma, size=n), p.max_duration_h)
    durations = np.maximum(durations, 0.25)
    return ArrivalTrace(
        arrivals_h=tuple(map(float, arrivals)), durations_h=tuple(map(float, durations))
    )


def load_philly_csv(path: Path) -> ArrivalTrace:
    """A Philly-derived trace: a CSV with `submit_time_h` (or `submit_time_s`) and
    `duration_h` (or `duration_s`) columns, one row per job."""
    arr: list[float] = []
    dur: list[float] = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if "submit_time_h" in row:
                arr.append(float(row["submit_time_h"]))
            elif "submit_time_s" in row:
                arr.append(float(row["submit_time_s"]) / 3600)
            else:
                raise ConfigError(f"{path}: needs a submit_time_h or submit_time_s column")
            if "duration_h" in row:
                dur.append(float(row["duration_h"]))
            elif "duration_s" in row:
                dur.append(float(row["duration_s"]) / 3600)
            else:
                raise ConfigError(f"{path}: needs a duration_h or duration_s column")
    start = min(arr, default=0.0)
    order = np.argsort(arr, kind="stable")
    return ArrivalTrace(
        arrivals_h=tuple(arr[i] - start for i in order), durations_h=tuple(dur[i] for i in order)
    )


def expected_solo_s(job: MuxJob, noise: NoiseModel) -> float:
    """Mean actual solo iteration time under the noise model."""
    lo, p = noise.rollout_max_frac_lo, noise.hit_max_prob
    roll = job.roll_s * (p + (1 - p) * (lo + 1) / 2)
    train = job.train_s * (noise.train_frac_lo + noise.train_frac_hi) / 2
    return roll + train + job.sync_s


def _job(
    job_id: str,
    size: str,
    gpus: int,
    roll: float,
    train: float,
    slo: float,
    bed: Testbed,
    *,
    model: str | None = None,
    max_len: int = SIM_MAX_LEN,
    **kw: object,
) -> MuxJob:
    nodes = max(1, gpus // bed.gpus_per_node)
    fp = footprint(size)
    speed = rollout_speed(model or SIZE_MODELS[size], fp.rollout_tp, max_len)
    tail_share = 1.0 - noise_model().tail_start_frac
    return MuxJob(
        job_id=job_id,
        size=size,
        rollout_nodes=nodes,
        train_nodes=nodes,
        roll_s=roll,
        train_s=train,
        sync_s=topology_aware_sync_s(PARAMS_B[size] * 2, gpus, gpus, bed),
        warm_s=switch_cost(size).warm_s,
        rollout_mem_gb=fp.rollout_gb,
        train_mem_gb=fp.train_gb,
        slo=slo,
        colocated_roll_s=roll * speed.time_ratio(tail_share),
        **kw,  # type: ignore[arg-type]
    )


def table6_jobs(
    kind: str,
    trace: ArrivalTrace,
    seed: int,
    *,
    slo: float | None = None,
    bed: Testbed | None = None,
) -> list[MuxJob]:
    """Jobs of one Table 6 workload (`balanced`, `rollout_heavy`, `train_heavy` or `mixed`) on
    the trace's arrivals; SLOs fixed or, when `slo` is None, drawn from Unif(1, 2)."""
    if kind not in KINDS:
        raise ConfigError(f"unknown Table 6 workload {kind!r}; known: {', '.join(KINDS)}")
    bed = bed or testbed()
    noise = noise_model()
    table = profiles()
    names = sorted(n for n in table if kind == "mixed" or table[n].kind == kind)
    rng = stream(seed, f"table6:{kind}")
    jobs = []
    for i, (arr, dur) in enumerate(zip(trace.arrivals_h, trace.durations_h, strict=True)):
        prof = table[names[int(rng.integers(len(names)))]]
        roll = float(rng.uniform(*prof.roll))
        train = float(rng.uniform(*prof.train))
        job_slo = float(rng.uniform(1.0, 2.0)) if slo is None else slo
        job = _job(
            f"j{i:04d}",
            prof.size,
            prof.gpus,
            roll,
            train,
            job_slo,
            bed,
            arrival_s=arr * 3600,
            kind=prof.name,
        )
        iters = max(1, round(dur * 3600 / expected_solo_s(job, noise)))
        jobs.append(MuxJob(**{**job.__dict__, "iterations": iters}))
    return jobs


def micro_job(
    type_name: str, job_id: str, iterations: int, *, slo: float = 2.0, bed: Testbed | None = None
) -> MuxJob:
    """A Table 3 job type as a `MuxJob`."""
    types = job_types()
    if type_name not in types:
        raise ConfigError(f"unknown Table 3 job type {type_name!r}; known: {', '.join(types)}")
    t = types[type_name]
    bed = bed or testbed()
    job = _job(
        job_id,
        t.size,
        t.n_r,
        t.roll_s,
        t.train_s,
        slo,
        bed,
        iterations=iterations,
        kind=type_name,
        model=t.model,
        max_len=t.max_len,
    )
    if t.n_t != t.n_r:
        job = MuxJob(**{**job.__dict__, "train_nodes": t.n_t // bed.gpus_per_node})
    return job


def production_jobs(seed: int, jobs: int | None = None) -> list[MuxJob]:
    """§7.4's trace: two weeks of arrivals (fewer jobs: a proportionally shorter span) with a
    mean job duration of 27.9 h; each job one of Table 3's production-derived types, uniformly,
    with its SLO drawn from Unif(1, 2)."""
    trace = _synthetic(production(), seed, "production", jobs, None)
    noise = noise_model()
    names = sorted(job_types())
    rng = stream(seed, "production:types")
    out = []
    for i, (arr, dur) in enumerate(zip(trace.arrivals_h, trace.durations_h, strict=True)):
        name = names[int(rng.integers(len(names)))]
        job = micro_job(name, f"p{i:04d}", 1, slo=float(rng.uniform(1.0, 2.0)))
        iters = max(1, round(dur * 3600 / expected_solo_s(job, noise)))
        out.append(MuxJob(**{**job.__dict__, "iterations": iters, "arrival_s": arr * 3600}))
    return out


def mean_concurrency(jobs: Sequence[MuxJob]) -> float:
    """Average number of jobs alive over the trace span (solo durations)."""
    noise = noise_model()
    busy = sum(j.iterations * expected_solo_s(j, noise) for j in jobs)
    span = max(j.arrival_s for j in jobs) - min(j.arrival_s for j in jobs)
    return busy / max(span, 1.0)
