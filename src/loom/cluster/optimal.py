"""The offline optimum (§7.5 "Opt"): exhaustive search over groupings and placements.

For a set of jobs it enumerates every group (at most `max_group_size` jobs) and, for each, every
training-pool size a member asks for (larger members fitted to it, as RollMux fits arriving
jobs) and every pinning of its rollouts onto rollout nodes up to relabeling, keeping the
cheapest layout that passes the same memory and worst-case SLO checks as RollMux. The
cheapest partition of the jobs into such groups is an exact set-partitioning MILP (scipy's
HiGHS).

As in §7.5, it "assigns arriving jobs to offline optimal placements ... including job reordering
and re-grouping that are infeasible in online deployments": every arrival re-plans all running
jobs from scratch, and Table 5 times that decision against the number of concurrent jobs. A
departure only releases the leaving job's nodes, as for every other policy.
`regroup_on_departure=True` also re-plans after departures (a stronger, per-instant optimum that
the paper does not describe).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from loom.cluster.group import GroupLayout, Member
from loom.cluster.job import MuxJob
from loom.cluster.policy import CLUSTER_POLICIES, ClusterPolicyKind, PolicyConfig, Regroup
from loom.cluster.rollmux.admission import check_layout

__all__ = ["OptTimeout", "OptimalScheduler", "pinnings"]


class OptTimeout(Exception):
    """The exact search exceeded its time budget."""


def pinnings(demands: Sequence[int]) -> Iterator[tuple[tuple[tuple[int, ...], ...], int]]:
    """Every assignment of jobs (needing `demands[i]` nodes) to rollout nodes, up to renaming
    the nodes: job i reuses some already-used nodes and opens the next unused ones in order.
    Yields (nodes per job, nodes used)."""

    def rec(
        i: int, used: int, acc: tuple[tuple[int, ...], ...]
    ) -> Iterator[tuple[tuple[tuple[int, ...], ...], int]]:
        if i == len(demands):
            yield acc, used
            return
        r = demands[i]
        for new in range(0, r + 1):
            reuse = r - new
            if reuse > used:
                continue
            for old in itertools.combinations(range(used), reuse):
                nodes = old + tuple(range(used, used + new))
                yield from rec(i + 1, used + new, (*acc, nodes))

    yield from rec(0, 0, ())


class OptimalScheduler:
    """Exact minimum-cost grouping of a job set; `on_arrival` regroups every active job."""

    def __init__(
        self,
        config: PolicyConfig,
        *,
        regroup_on_departure: bool = False,
        give_up: Callable[[], bool] | None = None,
    ) -> None:
        """`give_up`: polled while searching; True aborts with OptTimeout. The driver owns
        it (e.g. a wall-clock budget), so the policy itself never reads the clock."""
        self.config = config
        self.regroup_on_departure = regroup_on_departure
        self._give_up = give_up
        self._best: dict[frozenset[str], tuple[float, GroupLayout] | None] = {}

    def best_group(self, jobs: tuple[MuxJob, ...]) -> tuple[float, GroupLayout] | None:
        """Cheapest feasible layout of exactly these jobs as one group (memoized)."""
        key = frozenset(j.job_id for j in jobs)
        if key in self._best:
            return self._best[key]
        if self._give_up is not None and self._give_up():
            raise OptTimeout
        bed, host = self.config.bed, self.config.bed.host_memory_gb
        found: tuple[float, GroupLayout] | None = None
        mig = self.config.migration_s if len(jobs) > 1 else 0.0
        # Every training-pool size a member asks for; larger members are fitted to it.
        for train in sorted({j.native.train_nodes for j in jobs}):
            fit = [j.on_train_pool(train) for j in jobs]
            ways = sorted(pinnings([j.rollout_nodes for j in fit]), key=lambda a: a[1])
            for assign, used in ways:
                if found is not None and bed.cost_per_h(used, train) >= found[0]:
                    break
                layout = GroupLayout(
                    group_id=-1,
                    members=tuple(Member(job=j, nodes=n) for j, n in zip(fit, assign, strict=True)),
                    rollout_nodes=used,
                    train_nodes=train,
                )
                if check_layout(layout, host, mig).ok:
                    found = (layout.cost_per_h(bed), layout)
                    break
        self._best[key] = found
        return found

    def candidate_groups(self, jobs: Sequence[MuxJob]) -> list[tuple[float, GroupLayout]]:
        """Every feasible group; a superset of an infeasible group is never tried (adding a job
        only adds work and memory)."""
        out: list[tuple[float, GroupLayout]] = []
        level: list[tuple[int, ...]] = []
        for i, j in enumerate(jobs):
            g = self.best_group((j,))
            if g is not None:
                out.append(g)
                level.append((i,))
        feasible = set(level)
        for _size in range(2, self.config.max_group_size + 1):
            nxt: list[tuple[int, ...]] = []
            for combo in level:
                for k in range(combo[-1] + 1, len(jobs)):
                    cand = (*combo, k)
                    if any(
                        sub not in feasible for sub in itertools.combinations(cand, len(cand) - 1)
                    ):
                        continue
                    g = self.best_group(tuple(jobs[i] for i in cand))
                    if g is not None:
                        out.append(g)
                        nxt.append(cand)
            feasible.update(nxt)
            level = nxt
            if not level:
                break
        return out

    def solve(self, jobs: Sequence[MuxJob], first_group_id: int = 0) -> tuple[GroupLayout, ...]:
        """Minimum-cost partition of `jobs` into feasible groups."""
        if not jobs:
            return ()
        groups = self.candidate_groups(jobs)
        index = {j.job_id: i for i, j in enumerate(jobs)}
        a = np.zeros((len(jobs), len(groups)))
        for col, (_c, g) in enumerate(groups):
            for jid in g.job_ids:
                a[index[jid], col] = 1.0
        cost = np.array([c for c, _g in groups])
        res = milp(
            cost,
            constraints=LinearConstraint(a, lb=1.0, ub=1.0),
            integrality=np.ones(len(groups)),
            bounds=Bounds(0, 1),
        )
        assert res.success, f"set partitioning failed: {res.message}"
        chosen = [groups[c][1] for c in np.flatnonzero(res.x > 0.5)]
        return tuple(
            GroupLayout(
                group_id=first_group_id + i,
                members=g.members,
                rollout_nodes=g.rollout_nodes,
                train_nodes=g.train_nodes,
            )
            for i, g in enumerate(chosen)
        )

    def on_arrival(self, job: MuxJob, groups: Sequence[GroupLayout], next_group_id: int) -> Regroup:
        active = [m.job.native for g in groups for m in g.members] + [job]
        return Regroup(layouts=self.solve(active, next_group_id))

    def regroup(self, groups: Sequence[GroupLayout], next_group_id: int) -> Regroup | None:
        """After departures: the optimum of the jobs still running (None: keep the groups)."""
        if not self.regroup_on_departure:
            return None
        return Regroup(
            layouts=self.solve([m.job.native for g in groups for m in g.members], next_group_id)
        )

    def forget(self, job_ids: Sequence[str]) -> None:
        """Drop memoized groups of jobs that left (keeps the memo small over a long trace)."""
        gone = set(job_ids)
        self._best = {k: v for k, v in self._best.items() if not (k & gone)}


CLUSTER_POLICIES.add(ClusterPolicyKind.OPT, OptimalScheduler)
