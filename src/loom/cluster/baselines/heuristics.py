"""§7.5's heuristic inter-group baselines; both run the same round-robin groups as RollMux.

- `random`: a uniformly random choice among the groups that can accommodate the job (group
  size, training pool, host memory) and a new group; random rollout nodes inside it.
- `greedy` (most-idle): the accommodating group with the highest idle-time share under its
  worst-case round-robin plan, on its most idle rollout nodes; a new group only if none fits.
Neither checks SLOs: that is the point of the comparison.
"""

from __future__ import annotations

from collections.abc import Sequence

from loom.cluster.group import GroupLayout, Member
from loom.cluster.job import MuxJob
from loom.cluster.policy import CLUSTER_POLICIES, ClusterPolicyKind, Placement, PolicyConfig
from loom.cluster.rollmux.placements import can_join, fitted, isolated_layout, roomy_nodes
from loom.core.rng import stream

__all__ = ["GreedyMostIdle", "RandomFit", "idle_share"]


def idle_share(group: GroupLayout) -> float:
    """Share of provisioned node-time left idle by one worst-case meta-iteration."""
    period = max(group.cycle_s, group.load_s)
    if period <= 0:
        return 1.0
    busy = sum(group.node_roll_load_s) + group.train_load_s * group.train_nodes
    return 1.0 - busy / (period * (group.rollout_nodes + group.train_nodes))


def _fits(group: GroupLayout, job: MuxJob, config: PolicyConfig) -> list[int] | None:
    host = config.bed.host_memory_gb
    if not can_join(group, job, config.max_group_size, host):
        return None
    roomy = roomy_nodes(group, job, host)
    return roomy if len(roomy) >= job.rollout_nodes else None


def _new(job: MuxJob, gid: int, config: PolicyConfig) -> Placement:
    layout = isolated_layout(job, gid)
    return Placement(
        layout=layout,
        new_group=True,
        marginal_cost_h=layout.cost_per_h(config.bed),
        strategy="isolated",
    )


class RandomFit:
    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self.rng = stream(config.seed, "cluster:random")

    def on_arrival(
        self, job: MuxJob, groups: Sequence[GroupLayout], next_group_id: int
    ) -> Placement:
        options = [(g, roomy) for g in groups if (roomy := _fits(g, job, self.config)) is not None]
        pick = int(self.rng.integers(len(options) + 1))
        if pick == len(options):
            return _new(job, next_group_id, self.config)
        group, roomy = options[pick]
        chosen = self.rng.choice(len(roomy), size=job.rollout_nodes, replace=False)
        nodes = tuple(sorted(roomy[int(i)] for i in chosen))
        layout = group.with_member(Member(job=fitted(group, job), nodes=nodes), group.rollout_nodes)
        return Placement(layout=layout, new_group=False, marginal_cost_h=0.0, strategy="random")


class GreedyMostIdle:
    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

    def on_arrival(
        self, job: MuxJob, groups: Sequence[GroupLayout], next_group_id: int
    ) -> Placement:
        best: tuple[float, GroupLayout, list[int]] | None = None
        for g in groups:
            roomy = _fits(g, job, self.config)
            if roomy is not None and (best is None or idle_share(g) > best[0]):
                best = (idle_share(g), g, roomy)
        if best is None:
            return _new(job, next_group_id, self.config)
        _idle, group, roomy = best
        nodes = tuple(sorted(roomy[: job.rollout_nodes]))  # roomy is least-loaded first
        layout = group.with_member(Member(job=fitted(group, job), nodes=nodes), group.rollout_nodes)
        return Placement(layout=layout, new_group=False, marginal_cost_h=0.0, strategy="greedy")


CLUSTER_POLICIES.add(ClusterPolicyKind.RANDOM, RandomFit)
CLUSTER_POLICIES.add(ClusterPolicyKind.GREEDY, GreedyMostIdle)
