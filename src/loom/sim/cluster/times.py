"""Actual per-iteration phase times: seeded draws below the worst case (long-tailed rollouts)."""

from __future__ import annotations

import numpy as np

from loom.cluster.group import GroupLayout
from loom.cluster.job import MuxJob
from loom.cluster.params import NoiseModel
from loom.cluster.schedule import DurationFn, PhaseTimes
from loom.core.rng import stream

__all__ = ["IterationSampler"]


class IterationSampler:
    """Per job, `samples` iterations of (rollout, training) fractions of the worst case, keyed
    by (seed, job id) only: every policy sees the same draws for the same job."""

    def __init__(self, seed: int, noise: NoiseModel, samples: int = 16) -> None:
        self.seed, self.noise, self.samples = seed, noise, samples
        self._cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def fractions(self, job_id: str) -> tuple[np.ndarray, np.ndarray]:
        if job_id not in self._cache:
            rng = stream(self.seed, f"iter:{job_id}")
            nz, s = self.noise, self.samples
            roll = rng.uniform(nz.rollout_max_frac_lo, 1.0, size=s)
            roll[rng.random(s) < nz.hit_max_prob] = 1.0
            train = rng.uniform(nz.train_frac_lo, nz.train_frac_hi, size=s)
            self._cache[job_id] = (roll, train)
        return self._cache[job_id]

    def times(self, job: MuxJob, k: int) -> PhaseTimes:
        roll_f, train_f = self.fractions(job.job_id)
        i = k % self.samples
        roll = job.roll_s * float(roll_f[i])
        head = roll * self.noise.tail_start_frac
        return PhaseTimes(
            roll_head_s=head,
            roll_tail_s=roll - head,
            train_s=job.train_s * float(train_f[i]) + job.sync_s,
        )

    def solo_iteration_s(self, job: MuxJob) -> float:
        """Mean actual iteration time of `job` alone on its own pools."""
        roll_f, train_f = self.fractions(job.job_id)
        return float(np.mean(job.roll_s * roll_f + job.train_s * train_f + job.sync_s))

    def durations(self, layout: GroupLayout) -> DurationFn:
        jobs = [m.job for m in layout.members]
        return lambda i, k: self.times(jobs[i], k)
