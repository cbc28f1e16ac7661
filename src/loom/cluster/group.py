"""A co-execution group (§4.1): jobs pinned to a set of rollout nodes and a training pool."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from loom.cluster.job import MuxJob
from loom.cluster.params import Testbed

__all__ = ["GroupLayout", "Member"]


@dataclass(frozen=True, kw_only=True)
class Member:
    """A job and the group-local indices of the rollout nodes it is pinned to."""

    job: MuxJob
    nodes: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class GroupLayout:
    """Jobs sharing `rollout_nodes` rollout and `train_nodes` training nodes by time-multiplexing.

    Members train one after another on the training pool: a job that asked for more nodes than
    the pool has is fitted to it (its data parallelism is adjusted, §4.2 footnote 2, see
    `MuxJob.on_train_pool`); its rollout runs on its pinned `Member.nodes`. A `colocated` group runs
    both phases on its training nodes (the veRL baseline) and has no rollout nodes.
    """

    group_id: int
    members: tuple[Member, ...]
    rollout_nodes: int
    train_nodes: int
    colocated: bool = False

    def __post_init__(self) -> None:
        for m in self.members:
            assert len(set(m.nodes)) == len(m.nodes), f"{m.job.job_id} repeats a node"
            assert all(0 <= n < self.rollout_nodes for n in m.nodes), (
                f"{m.job.job_id} pinned outside the group's {self.rollout_nodes} rollout nodes"
            )
            assert self.colocated or len(m.nodes) == m.job.rollout_nodes, (
                f"{m.job.job_id} needs {m.job.rollout_nodes} rollout nodes, got {m.nodes}"
            )

    def cost_per_h(self, bed: Testbed) -> float:
        return bed.cost_per_h(self.rollout_nodes, self.train_nodes)

    @cached_property
    def job_ids(self) -> tuple[str, ...]:
        return tuple(m.job.job_id for m in self.members)

    @cached_property
    def node_roll_load_s(self) -> tuple[float, ...]:
        """Worst-case rollout seconds per meta-iteration on each rollout node."""
        load = [0.0] * self.rollout_nodes
        for m in self.members:
            for n in m.nodes:
                load[n] += m.job.roll_s
        return tuple(load)

    @cached_property
    def train_load_s(self) -> float:
        return sum(m.job.train_total_s for m in self.members)

    @cached_property
    def load_s(self) -> float:
        """T_G^load: busiest node's work per meta-iteration (§4.2)."""
        return max(self.train_load_s, max(self.node_roll_load_s, default=0.0))

    @cached_property
    def cycle_s(self) -> float:
        """T_G^cycle: the longest member's solo iteration time."""
        return max((m.job.solo_s for m in self.members), default=0.0)

    @cached_property
    def slo_cycle_s(self) -> float:
        """The longest meta-iteration every member's SLO tolerates: min_k SLO_k x T_k^solo."""
        return min((m.job.slo_bound_s for m in self.members), default=float("inf"))

    @property
    def saturated(self) -> bool:
        """No slack left to absorb another job's phases (Algorithm 1, line 4): the busiest
        node's work reaches the natural cycle, T_G^load >= T_G^cycle (§4.2, as the issue
        states it)."""
        return self.load_s >= self.cycle_s

    @property
    def slo_saturated(self) -> bool:
        """The lossless variant of line 4: the busiest node's work already exceeds the longest
        meta-iteration every member's SLO tolerates, so every placement in the group breaks an
        SLO (a member's period is at least the work of each node it uses, and a job only adds
        work). NOTE: the natural-cycle test also prunes groups that could still take a job
        within every SLO (SLO > 1 accepts a slower cycle), which the optimum packs; at SLO 2.0
        that costs RollMux several percent against it (`rollmux_slo_prune` in fig14)."""
        return self.load_s > self.slo_cycle_s + 1e-9

    @cached_property
    def node_rollout_mem_gb(self) -> tuple[float, ...]:
        mem = [0.0] * self.rollout_nodes
        for m in self.members:
            for n in m.nodes:
                mem[n] += m.job.rollout_mem_gb
        return tuple(mem)

    @cached_property
    def train_mem_gb(self) -> float:
        """Host memory used on every training node (each caches every member's trainer)."""
        return sum(m.job.train_mem_gb for m in self.members)

    def fits_memory(self, host_memory_gb: float) -> bool:
        """The residency constraint: every node caches all its jobs' state."""
        eps = 1e-9
        return self.train_mem_gb <= host_memory_gb + eps and all(
            mem <= host_memory_gb + eps for mem in self.node_rollout_mem_gb
        )

    def with_member(self, member: Member, rollout_nodes: int) -> GroupLayout:
        return GroupLayout(
            group_id=self.group_id,
            members=(*self.members, member),
            rollout_nodes=rollout_nodes,
            train_nodes=self.train_nodes,
            colocated=self.colocated,
        )

    def without(self, job_ids: Sequence[str]) -> GroupLayout:
        """The group after `job_ids` leave: unused rollout nodes are released (renumbered) and
        the training pool shrinks to the largest remaining demand."""
        gone = set(job_ids)
        keep = [m for m in self.members if m.job.job_id not in gone]
        if self.colocated:
            used: list[int] = []
        else:
            used = sorted({n for m in keep for n in m.nodes})
        index = {n: i for i, n in enumerate(used)}
        members = tuple(Member(job=m.job, nodes=tuple(index[n] for n in m.nodes)) for m in keep)
        return GroupLayout(
            group_id=self.group_id,
            members=members,
            rollout_nodes=len(used),
            train_nodes=max((m.job.train_nodes for m in keep), default=0),
            colocated=self.colocated,
        )
