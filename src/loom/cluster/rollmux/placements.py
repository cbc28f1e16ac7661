"""Candidate placements of an arriving job (§4.2, Fig. 5): direct packing, rollout scaling,
isolated provisioning."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from loom.cluster.group import GroupLayout, Member
from loom.cluster.job import MuxJob

__all__ = ["Candidate", "can_join", "fitted", "generate_placements", "isolated_layout"]


@dataclass(frozen=True, slots=True)
class Candidate:
    layout: GroupLayout
    new_rollout_nodes: int
    strategy: str


def isolated_layout(job: MuxJob, group_id: int) -> GroupLayout:
    """A fresh group holding only `job` on its own nodes."""
    return GroupLayout(
        group_id=group_id,
        members=(Member(job=job, nodes=tuple(range(job.rollout_nodes))),),
        rollout_nodes=job.rollout_nodes,
        train_nodes=job.train_nodes,
    )


def fitted(group: GroupLayout, job: MuxJob) -> MuxJob:
    """`job` as it would run in `group`: fitted to the group's training pool."""
    return job.on_train_pool(group.train_nodes)


def can_join(group: GroupLayout, job: MuxJob, max_group_size: int, host_memory_gb: float) -> bool:
    """Group size and training-node memory allow `job` (fitted to the pool) at all."""
    return (
        not group.colocated
        and len(group.members) < max_group_size
        and group.train_mem_gb + fitted(group, job).train_mem_gb <= host_memory_gb + 1e-9
    )


def roomy_nodes(group: GroupLayout, job: MuxJob, host_memory_gb: float) -> list[int]:
    """Existing rollout nodes with memory for `job`, least worst-case rollout load first."""
    mem, load = group.node_rollout_mem_gb, group.node_roll_load_s
    ok = [
        n
        for n in range(group.rollout_nodes)
        if mem[n] + job.rollout_mem_gb <= host_memory_gb + 1e-9
    ]
    return sorted(ok, key=lambda n: (load[n], n))


def generate_placements(
    group: GroupLayout, job: MuxJob, host_memory_gb: float
) -> Iterator[Candidate]:
    """Direct packing onto the least-loaded roomy nodes, then rollout scaling with 1..r new
    nodes (just enough: the rest of the job's nodes stay on existing ones); the job is fitted
    to the group's training pool."""
    job = fitted(group, job)
    r = job.rollout_nodes
    roomy = roomy_nodes(group, job, host_memory_gb)
    for new in range(0, r + 1):
        reuse = r - new
        if reuse > len(roomy):
            continue
        nodes = tuple(roomy[:reuse]) + tuple(range(group.rollout_nodes, group.rollout_nodes + new))
        yield Candidate(
            layout=group.with_member(Member(job=job, nodes=nodes), group.rollout_nodes + new),
            new_rollout_nodes=new,
            strategy="direct" if new == 0 else "scale",
        )
