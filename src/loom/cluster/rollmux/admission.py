"""Admission checks of a candidate group layout under worst-case phase times (§4.2).

The co-executed iteration time of every member is the meta-iteration period of the group's
round-robin schedule, simulated with worst-case durations. Two exact shortcuts skip the
simulation: a lower bound (busiest node's work, longest member's cycle) that already breaks an
SLO, and Theorem 1 for unsaturated groups whose members share one set of rollout nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from loom.cluster.group import GroupLayout
from loom.cluster.schedule import run_round_robin, worst_case_times

__all__ = ["Admission", "check_layout", "worst_case_periods"]

EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Admission:
    """Outcome of checking one layout: `ok` when memory and every SLO hold."""

    ok: bool
    memory_ok: bool
    period_s: float  # worst-case meta-iteration period (inf when not computed)
    reason: str = ""


def _effective(layout: GroupLayout, migration_s: float) -> tuple[float, float]:
    """(T_load, T_cycle) with the overheads the round-robin pays in steady state: in a shared
    group every training phase is a warm start (the pool alternates between members) and every
    rollout pays the migration overhead; a rollout is a warm start only when one of its nodes
    is shared, since a member alone on its nodes finds its own state still loaded there."""
    if len(layout.members) == 1:
        m = layout.members[0]
        return max(m.job.roll_s, m.job.train_total_s), m.job.solo_s
    users = [0] * layout.rollout_nodes
    for m in layout.members:
        for n in m.nodes:
            users[n] += 1
    node = [0.0] * layout.rollout_nodes
    train = cycle = 0.0
    for m in layout.members:
        roll = (
            m.job.roll_s
            + migration_s
            + (m.job.warm_s if any(users[n] > 1 for n in m.nodes) else 0.0)
        )
        for n in m.nodes:
            node[n] += roll
        train += m.job.train_total_s + m.job.warm_s
        cycle = max(cycle, roll + m.job.train_total_s + m.job.warm_s)
    return max(train, max(node, default=0.0)), cycle


def worst_case_periods(layout: GroupLayout, migration_s: float = 0.0) -> float:
    """Worst-case steady-state meta-iteration period of the group (every member's iteration)."""
    n = len(layout.members)
    if n == 1:
        return layout.members[0].job.solo_s
    load, cycle = _effective(layout, migration_s)
    one_node_set = len({m.nodes for m in layout.members}) == 1
    if one_node_set and load <= cycle + EPS:
        return cycle  # Theorem 1: the round-robin cycle is the longest member's iteration
    iterations = 2 * n + 3
    sched = run_round_robin(
        layout,
        worst_case_times(layout, migration_s),
        iterations,
        record=False,
    )
    window = n + 1
    return max(sched.period_s(i, window) for i in range(n))


def check_layout(layout: GroupLayout, host_memory_gb: float, migration_s: float = 0.0) -> Admission:
    """Memory residency, then every member's SLO under worst-case durations."""
    if not layout.fits_memory(host_memory_gb):
        return Admission(ok=False, memory_ok=False, period_s=float("inf"), reason="memory")
    bound = min(m.job.slo_bound_s for m in layout.members)
    if len(layout.members) > 1:
        load, cycle = _effective(layout, migration_s)
        if max(load, cycle) > bound + EPS:
            return Admission(ok=False, memory_ok=True, period_s=float("inf"), reason="slo-bound")
    period = worst_case_periods(layout, migration_s)
    if period > bound + EPS:
        return Admission(ok=False, memory_ok=True, period_s=period, reason="slo")
    return Admission(ok=True, memory_ok=True, period_s=period)
