"""RollMux's inter-group scheduler (Algorithm 1): the cheapest SLO- and memory-safe placement.

Saturated groups are pruned; each remaining group offers direct packing and rollout scaling;
candidates breaking memory residency or any member's SLO (worst-case durations) are dropped;
the minimum marginal cost wins, against an isolated group. Linear in the number of groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from loom.cluster.group import GroupLayout
from loom.cluster.job import MuxJob
from loom.cluster.policy import (
    CLUSTER_POLICIES,
    ClusterPolicyKind,
    Placement,
    PolicyConfig,
)
from loom.cluster.rollmux.admission import check_layout
from loom.cluster.rollmux.placements import can_join, generate_placements, isolated_layout
from loom.core.errors import ConfigError

__all__ = ["RollMuxScheduler"]


class RollMuxScheduler:
    """Algorithm 1. Ties in marginal cost keep the first placement found (line 13 updates the
    record only on a strictly lower cost): groups in the order given, which is creation order,
    and inside a group the order of `generate_placements`.

    `prune`: "cycle" skips groups with T_load >= T_cycle (§4.2, line 4); "slo" skips only
    groups that no placement could join within every member's SLO (`GroupLayout.slo_saturated`).
    """

    def __init__(self, config: PolicyConfig, prune: Literal["cycle", "slo"] = "cycle") -> None:
        if prune not in ("cycle", "slo"):
            raise ConfigError(f"prune must be 'cycle' or 'slo', got {prune!r}")
        self.config = config
        self.prune = prune
        self.evaluated = 0  # candidate layouts checked, for the decision-latency benchmark

    def on_arrival(
        self, job: MuxJob, groups: Sequence[GroupLayout], next_group_id: int
    ) -> Placement:
        bed, host = self.config.bed, self.config.bed.host_memory_gb
        best: Placement | None = None
        best_delta = float("inf")
        node_price = bed.rollout_node_price_h
        for group in groups:
            full = group.saturated if self.prune == "cycle" else group.slo_saturated
            if full or not can_join(group, job, self.config.max_group_size, host):
                continue
            for cand in generate_placements(group, job, host):
                delta = cand.new_rollout_nodes * node_price
                if delta >= best_delta:
                    break  # later candidates of this group only add nodes
                self.evaluated += 1
                if not check_layout(cand.layout, host, self.config.migration_s).ok:
                    continue
                best_delta = delta
                best = Placement(
                    layout=cand.layout,
                    new_group=False,
                    marginal_cost_h=delta,
                    strategy=cand.strategy,
                )
                break  # the cheapest valid candidate of this group is found
        iso = isolated_layout(job, next_group_id)
        iso_cost = iso.cost_per_h(bed)
        if best is None or iso_cost < best.marginal_cost_h:
            return Placement(
                layout=iso, new_group=True, marginal_cost_h=iso_cost, strategy="isolated"
            )
        return best


CLUSTER_POLICIES.add(ClusterPolicyKind.ROLLMUX, RollMuxScheduler)
CLUSTER_POLICIES.add(
    ClusterPolicyKind.ROLLMUX_SLO_PRUNE, lambda config: RollMuxScheduler(config, prune="slo")
)
