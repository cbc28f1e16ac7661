"""Builders of small RollMux worlds for the cluster tests."""

from __future__ import annotations

from loom.cluster.group import GroupLayout, Member
from loom.cluster.job import MuxJob


def job(
    jid: str, roll: float, train: float, *, nodes: int = 1, slo: float = 2.0, **kw: object
) -> MuxJob:
    return MuxJob(
        job_id=jid,
        size="7b",
        rollout_nodes=nodes,
        train_nodes=kw.pop("train_nodes", nodes),  # type: ignore[arg-type]
        roll_s=roll,
        train_s=train,
        slo=slo,
        **kw,  # type: ignore[arg-type]
    )


def one_node_group(*jobs: MuxJob) -> GroupLayout:
    return GroupLayout(
        group_id=0,
        members=tuple(Member(job=j, nodes=(0,)) for j in jobs),
        rollout_nodes=1,
        train_nodes=1,
    )
