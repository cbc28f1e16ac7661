"""Baselines without phase multiplexing: every job gets its own GPUs for its whole life.

- `solo_d`: dedicated rollout and training nodes, 1:1 (standard disaggregation).
- `verl`: co-located, rollout and training serialize on the job's training (H800) nodes, so it
  pays H800 prices for the sum of the phase times; rollout runs at H800 decode speed
  (`MuxJob.colocated_roll_s`) and the weights are resharded locally (a warm switch) instead of
  synchronized across the slow link.
- `gavel_plus`: job-level, heterogeneity-aware allocation (Gavel [29] made RL-aware): it picks
  the number of rollout nodes that maximizes the job's throughput per dollar, but never
  interleaves phases of different jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from loom.cluster.group import GroupLayout, Member
from loom.cluster.job import MuxJob
from loom.cluster.params import scaling
from loom.cluster.policy import CLUSTER_POLICIES, ClusterPolicyKind, Placement, PolicyConfig
from loom.cluster.rollmux.placements import isolated_layout

__all__ = ["GavelPlus", "SoloDisaggregated", "VerlColocated", "colocated_job"]


class SoloDisaggregated:
    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

    def on_arrival(
        self, job: MuxJob, groups: Sequence[GroupLayout], next_group_id: int
    ) -> Placement:
        layout = isolated_layout(job, next_group_id)
        return Placement(
            layout=layout,
            new_group=True,
            marginal_cost_h=layout.cost_per_h(self.config.bed),
            strategy="solo",
        )


def colocated_job(job: MuxJob) -> MuxJob:
    """The job as veRL runs it: rollout on the training GPUs, a local reshard instead of a sync."""
    roll = job.roll_s if job.colocated_roll_s is None else job.colocated_roll_s
    return replace(job, roll_s=roll, sync_s=job.warm_s)


class VerlColocated:
    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

    def on_arrival(
        self, job: MuxJob, groups: Sequence[GroupLayout], next_group_id: int
    ) -> Placement:
        layout = GroupLayout(
            group_id=next_group_id,
            members=(Member(job=colocated_job(job), nodes=()),),
            rollout_nodes=0,
            train_nodes=job.train_nodes,
            colocated=True,
        )
        return Placement(
            layout=layout,
            new_group=True,
            marginal_cost_h=layout.cost_per_h(self.config.bed),
            strategy="colocated",
        )


class GavelPlus:
    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self.scaling = scaling()

    def scaled_job(self, job: MuxJob, factor: int) -> MuxJob:
        roll = self.scaling.rollout_time_s(job.roll_s, factor)
        return replace(job, rollout_nodes=job.rollout_nodes * factor, roll_s=roll)

    def on_arrival(
        self, job: MuxJob, groups: Sequence[GroupLayout], next_group_id: int
    ) -> Placement:
        bed = self.config.bed
        best: tuple[float, GroupLayout] | None = None
        for factor in range(1, self.scaling.gavel_max_rollout_factor + 1):
            scaled = self.scaled_job(job, factor)
            layout = isolated_layout(scaled, next_group_id)
            dollars_per_iteration = layout.cost_per_h(bed) * scaled.solo_s
            if best is None or dollars_per_iteration < best[0] - 1e-9:
                best = (dollars_per_iteration, layout)
        assert best is not None
        return Placement(
            layout=best[1],
            new_group=True,
            marginal_cost_h=best[1].cost_per_h(bed),
            strategy="gavel",
        )


CLUSTER_POLICIES.add(ClusterPolicyKind.SOLO_D, SoloDisaggregated)
CLUSTER_POLICIES.add(ClusterPolicyKind.VERL, VerlColocated)
CLUSTER_POLICIES.add(ClusterPolicyKind.GAVEL_PLUS, GavelPlus)
