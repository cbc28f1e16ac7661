"""Heddle's trajectory-aware placement (§5): split length-sorted trajectories into contiguous
groups, one per worker, minimising Formula 2's makespan max_g F(|g|) × max_{i∈g} L_i × T.

Every group cost is evaluated as the float expression ``L * token_time * F(size)`` (left to
right), both by the solvers and by anyone recomputing the makespan from ``Placement.groups``.

Two solvers share that cost model:

* `PresortedPlacer` (used by `presorted_dp` and `presorted_dp_hetero`) is exact and fast. By
  Lemma 5.1 an optimal partition is contiguous in descending-length order. For a bound B the
  greedy "each worker in turn takes as many of the next trajectories as fit under B" is optimal
  for feasibility (it stays ahead of any feasible partition), so feasibility is monotone in B and
  the optimum is the smallest float B that is feasible. The search bisects the bit patterns of
  non-negative floats (monotone in value) and jumps: a feasible probe lowers the upper bound to
  the makespan it achieved, an infeasible one raises the lower bound to the cheapest one-item
  extension of any of its groups (no bound below that changes the greedy's outcome). It needs at
  most 64 probes of O(m log n) each, and needs no aggregation of short trajectories.
* `presorted_dp_reference` is the paper's O(n²m) recurrence (Formula 3), vectorised over the
  split point with numpy; it optionally runs on blocks of aggregated short trajectories
  (`aggregate_short`), Heddle's speed-up heuristic, whose makespan is never below the optimum.
"""

from __future__ import annotations

import math
import operator
import struct
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple, TypeAlias

import numpy as np
import numpy.typing as npt

from loom.core.errors import ConfigError

__all__ = [
    "Blocks",
    "Interference",
    "Lengths",
    "Placement",
    "PresortedPlacer",
    "WorkerCost",
    "aggregate_short",
    "presorted_dp",
    "presorted_dp_hetero",
    "presorted_dp_reference",
]

Interference: TypeAlias = (
    Callable[[int], float] | Mapping[int, float] | Sequence[float] | npt.NDArray[np.floating]
)
"""Interference factor F by group size: a callable, a mapping, or a sequence indexed by size
(index 0 unused). It must be finite, > 0 and non-decreasing over sizes 1..n."""

Lengths: TypeAlias = Sequence[float] | npt.NDArray[np.floating]


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Which trajectories share a worker, and the Formula 2 makespan that results."""

    makespan: float = field(metadata={"help": "max over groups of L_max * token_time * F(size)"})
    groups: tuple[tuple[int, ...], ...] = field(
        metadata={"help": "indices into the original lengths, longest first; group 0 the longest"}
    )
    group_makespans: tuple[float, ...] = field(
        metadata={"help": "each group's L_max * token_time * F(size); 0.0 for an empty group"}
    )

    def __post_init__(self) -> None:
        assert len(self.groups) == len(self.group_makespans), "one makespan per group"

    @property
    def sizes(self) -> tuple[int, ...]:
        """Number of trajectories in each group."""
        return tuple(len(g) for g in self.groups)

    @property
    def num_items(self) -> int:
        """Number of trajectories placed."""
        return sum(self.sizes)

    @cached_property
    def assignment(self) -> tuple[int, ...]:
        """Group of each trajectory, indexed like the original lengths."""
        out = [0] * self.num_items
        for j, group in enumerate(self.groups):
            for i in group:
                out[i] = j
        return tuple(out)


@dataclass(frozen=True, eq=False)
class WorkerCost:
    """Cost model of one rollout worker: base per-token time T and interference factor F."""

    token_time: float = field(metadata={"help": "base per-token time at batch size 1 (> 0)"})
    interference: Interference = field(metadata={"help": "F by group size, non-decreasing"})

    def __post_init__(self) -> None:
        _check_token_time(self.token_time)


class _Table(NamedTuple):
    """A worker's normalised cost: token time and factors[s] = F(s) for s in 1..n (0 unused)."""

    token_time: float
    factors: list[float]


class _Probe(NamedTuple):
    """Outcome of the greedy under one bound."""

    feasible: bool
    sizes: list[int]
    achieved: float  # max group cost of the greedy partition
    next_bound: float  # cheapest one-item extension of any group (a lower bound if infeasible)


# ---------------------------------------------------------------------------------------------
# Validation and normalisation


def _check_token_time(token_time: float) -> float:
    t = float(token_time)
    if not (math.isfinite(t) and t > 0):
        raise ConfigError(f"token_time must be finite and > 0, got {token_time!r}")
    return t


def _check_num_workers(num_workers: int) -> int:
    try:
        m = operator.index(num_workers)
    except TypeError:
        raise ConfigError(f"num_workers must be an integer, got {num_workers!r}") from None
    if m < 1:
        raise ConfigError(f"num_workers must be >= 1, got {m}")
    return m


def _check_lengths(lengths: Lengths) -> npt.NDArray[np.float64]:
    try:
        arr = np.asarray(lengths, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"lengths must be a 1-D sequence of numbers: {exc}") from None
    if arr.ndim != 1:
        raise ConfigError(f"lengths must be 1-D, got shape {arr.shape}")
    bad = np.flatnonzero(~(np.isfinite(arr) & (arr >= 0)))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(f"lengths[{i}] = {arr[i]}: trajectory lengths must be finite and >= 0")
    return arr + 0.0  # NOTE: turns -0.0 into +0.0, which keeps float bit patterns monotone


def _raw_factors(interference: Interference, n: int) -> npt.NDArray[np.float64]:
    """F(1..n) as an array (validation is separate)."""
    if isinstance(interference, Mapping):
        missing = [s for s in range(1, n + 1) if s not in interference]
        if missing:
            raise ConfigError(f"interference has no factor for group size {missing[0]}")
        return np.array([float(interference[s]) for s in range(1, n + 1)], dtype=np.float64)
    if callable(interference):
        return np.array([float(interference(s)) for s in range(1, n + 1)], dtype=np.float64)
    try:
        arr = np.asarray(interference, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"interference must be a callable, mapping or sequence: {exc}") from None
    if arr.ndim != 1 or arr.shape[0] <= n:
        raise ConfigError(
            f"interference sequence is indexed by group size (index 0 unused) and must cover "
            f"sizes 1..{n}, got shape {arr.shape}"
        )
    return arr[1 : n + 1]


def _check_factors(f: npt.NDArray[np.float64]) -> None:
    bad = np.flatnonzero(~(np.isfinite(f) & (f > 0)))
    if bad.size:
        s = int(bad[0]) + 1
        raise ConfigError(
            f"interference factor for group size {s} must be finite and > 0, got {f[s - 1]}"
        )
    drops = np.flatnonzero(np.diff(f) < 0)
    if drops.size:
        s = int(drops[0]) + 2
        raise ConfigError(
            f"interference must be non-decreasing in group size: "
            f"F({s}) = {f[s - 1]} < F({s - 1}) = {f[s - 2]}"
        )


def _factor_array(interference: Interference, n: int) -> npt.NDArray[np.float64]:
    """Validated factors indexed by size, index 0 holding an unused 0.0."""
    f = _raw_factors(interference, n)
    _check_factors(f)
    return np.concatenate(([0.0], f))


# ---------------------------------------------------------------------------------------------
# The exact engine


def _float_bits(x: float) -> int:
    bits: int = struct.unpack("<q", struct.pack("<d", x))[0]
    return bits


def _bits_float(b: int) -> float:
    value: float = struct.unpack("<d", struct.pack("<q", b))[0]
    return value


def _fit(x: float, factors: list[float], rem: int, bound: float) -> int:
    """Largest s <= rem with x * F(s) <= bound (x = L_start * token_time)."""
    if x == 0.0:
        return rem
    s = bisect_right(factors, bound / x, 1, rem + 1) - 1
    if (s >= 1 and x * factors[s] > bound) or (s < rem and x * factors[s + 1] <= bound):
        # NOTE: the division above can round across the boundary; redo it exactly.
        s = bisect_right(factors, bound, 1, rem + 1, key=lambda f: x * f) - 1
    return s


def _probe(lengths: list[float], tables: list[_Table], run_end: list[int], bound: float) -> _Probe:
    """Greedy: each worker in order takes as many of the next trajectories as fit under bound."""
    n, m = len(lengths), len(tables)
    sizes = [0] * m
    pos, j, achieved, next_bound = 0, 0, 0.0, math.inf
    while j < m and pos < n:
        x = lengths[pos] * tables[j].token_time
        factors, rem = tables[j].factors, n - pos
        s = _fit(x, factors, rem, bound)
        if s < rem:
            next_bound = min(next_bound, x * factors[s + 1])
        if s == 0:
            j = run_end[j]  # identical workers that follow cannot start here either
            continue
        achieved = max(achieved, x * factors[s])
        sizes[j], pos, j = s, pos + s, j + 1
    return _Probe(pos == n, sizes, achieved, next_bound)


def _run_ends(tables: list[_Table]) -> list[int]:
    """run_end[j]: first index after j whose table is a different object."""
    ends = [len(tables)] * len(tables)
    for j in range(len(tables) - 2, -1, -1):
        ends[j] = ends[j + 1] if tables[j + 1] is tables[j] else j + 1
    return ends


def _search(lengths: list[float], tables: list[_Table]) -> list[int]:
    """Group sizes of an optimal contiguous partition (the smallest feasible float bound)."""
    if not lengths:
        return [0] * len(tables)
    run_end = _run_ends(tables)
    best = _probe(lengths, tables, run_end, math.inf)
    lo, hi = min(lengths[0] * t.token_time * t.factors[1] for t in tables), best.achieved
    while lo < hi:
        bound = _bits_float((_float_bits(lo) + _float_bits(hi)) // 2)
        probe = _probe(lengths, tables, run_end, bound)
        if probe.feasible:
            best, hi = probe, probe.achieved
        else:
            lo = probe.next_bound
    return best.sizes


def _assemble(
    order: list[int], lengths: list[float], tables: list[_Table], sizes: list[int]
) -> Placement:
    groups: list[tuple[int, ...]] = []
    costs: list[float] = []
    pos = 0
    for table, s in zip(tables, sizes, strict=True):
        groups.append(tuple(order[pos : pos + s]))
        costs.append(lengths[pos] * table.token_time * table.factors[s] if s else 0.0)
        pos += s
    assert pos == len(order), "the partition must place every trajectory"
    return Placement(
        makespan=max(costs, default=0.0), groups=tuple(groups), group_makespans=tuple(costs)
    )


class PresortedPlacer:
    """Sorts trajectory lengths once, then places them exactly on any ordered worker sequence.

    Worker j receives the j-th contiguous block of the descending order (possibly empty), as
    Heddle §6.2 maps the i-th longest partition to the i-th worker; callers order workers by
    descending model-parallel degree. Normalised interference tables are cached per
    `WorkerCost` object, so reusing the same objects across `solve` calls is cheap.
    """

    def __init__(self, lengths: Lengths) -> None:
        arr = _check_lengths(lengths)
        order = np.argsort(-arr, kind="stable")
        self._order: list[int] = order.tolist()
        self._lengths: list[float] = arr[order].tolist()
        self._tables: dict[int, tuple[WorkerCost, _Table]] = {}

    @property
    def order(self) -> tuple[int, ...]:
        """Original indices by descending length, ties by index."""
        return tuple(self._order)

    def solve(self, workers: Sequence[WorkerCost]) -> Placement:
        """Optimal contiguous placement; groups align with workers and may be empty."""
        if not workers:
            raise ConfigError("placement needs at least one worker")
        tables = [self._table(w) for w in workers]
        sizes = _search(self._lengths, tables)
        return _assemble(self._order, self._lengths, tables, sizes)

    def _table(self, worker: WorkerCost) -> _Table:
        if not isinstance(worker, WorkerCost):
            raise ConfigError(f"workers must be WorkerCost objects, got {worker!r}")
        hit = self._tables.get(id(worker))
        if hit is None:
            factors = _factor_array(worker.interference, len(self._lengths)).tolist()
            hit = (worker, _Table(float(worker.token_time), factors))
            self._tables[id(worker)] = hit  # NOTE: holding the worker keeps its id unique
        return hit[1]


def presorted_dp_hetero(lengths: Lengths, workers: Sequence[WorkerCost]) -> Placement:
    """Exact placement on ordered heterogeneous workers: group j (possibly empty) runs on
    worker j, and groups are contiguous in descending-length order (the Heddle mapping)."""
    return PresortedPlacer(lengths).solve(workers)


def presorted_dp(
    lengths: Lengths, num_workers: int, interference: Interference, token_time: float = 1.0
) -> Placement:
    """Exact Formula 2 optimum over partitions into at most num_workers non-empty groups."""
    m = _check_num_workers(num_workers)
    placer = PresortedPlacer(lengths)
    worker = WorkerCost(token_time, interference)
    full = placer.solve([worker] * min(m, max(len(placer.order), 1)))
    return _drop_empty(full)


def _drop_empty(placement: Placement) -> Placement:
    kept = [(g, c) for g, c in zip(placement.groups, placement.group_makespans, strict=True) if g]
    return Placement(
        makespan=placement.makespan,
        groups=tuple(g for g, _ in kept),
        group_makespans=tuple(c for _, c in kept),
    )


# ---------------------------------------------------------------------------------------------
# Short-trajectory aggregation and the Formula 3 reference


@dataclass(frozen=True, kw_only=True)
class Blocks:
    """Sorted trajectories cut into consecutive blocks that placement keeps together."""

    order: tuple[int, ...] = field(metadata={"help": "original indices, descending length"})
    starts: tuple[int, ...] = field(metadata={"help": "offset of each block in order"})
    lengths: tuple[float, ...] = field(metadata={"help": "block length = its longest member's"})
    counts: tuple[int, ...] = field(metadata={"help": "members per block (adds to group size)"})

    def members(self, block: int) -> tuple[int, ...]:
        """Original indices of one block's trajectories."""
        start = self.starts[block]
        return self.order[start : start + self.counts[block]]


def aggregate_short(lengths: Lengths, threshold: float) -> Blocks:
    """Heddle's aggregation: after sorting, consecutive trajectories shorter than threshold merge
    into blocks whose summed length stays <= threshold; longer ones stay single.

    A block counts its members toward group size and its longest member as its length, so the
    DP on blocks solves a restricted problem: its makespan is never below the exact optimum.
    Threshold 0 leaves every trajectory on its own.
    """
    arr = _check_lengths(lengths)
    limit = float(threshold)
    if not (math.isfinite(limit) and limit >= 0):
        raise ConfigError(f"aggregation threshold must be finite and >= 0, got {threshold!r}")
    order = np.argsort(-arr, kind="stable").tolist()
    sorted_lengths = arr[order].tolist()
    starts, counts = _cut_blocks(sorted_lengths, limit)
    return Blocks(
        order=tuple(order),
        starts=tuple(starts),
        lengths=tuple(sorted_lengths[s] for s in starts),
        counts=tuple(counts),
    )


def _cut_blocks(sorted_lengths: list[float], limit: float) -> tuple[list[int], list[int]]:
    starts: list[int] = []
    counts: list[int] = []
    pos, n = 0, len(sorted_lengths)
    while pos < n:
        end, total = pos + 1, sorted_lengths[pos]
        if total < limit:
            while end < n and total + sorted_lengths[end] <= limit:
                total += sorted_lengths[end]
                end += 1
        starts.append(pos)
        counts.append(end - pos)
        pos = end
    return starts, counts


def presorted_dp_reference(
    lengths: Lengths,
    num_workers: int,
    interference: Interference,
    token_time: float = 1.0,
    *,
    aggregate_below: float | None = None,
) -> Placement:
    """The paper's O(n²m) presorted DP (Formula 3), allowing at most num_workers groups.

    With aggregate_below set, it runs on `aggregate_short` blocks (fewer states, makespan >= the
    optimum); the exact fast `presorted_dp` never needs that.
    """
    m = _check_num_workers(num_workers)
    t = _check_token_time(token_time)
    blocks = aggregate_short(lengths, 0.0 if aggregate_below is None else aggregate_below)
    factors = _factor_array(interference, len(blocks.order))
    with np.errstate(over="ignore"):  # NOTE: an overflowing cost is +inf, as in Python floats
        x = np.asarray(blocks.lengths, dtype=np.float64) * t
        cum = np.concatenate(([0], np.cumsum(blocks.counts, dtype=np.int64)))
        choice = _formula3(x, cum, factors, min(m, len(x)))
    return _reference_placement(blocks, choice, factors, t)


def _formula3(
    x: npt.NDArray[np.float64],
    cum: npt.NDArray[np.int64],
    factors: npt.NDArray[np.float64],
    m: int,
) -> npt.NDArray[np.int64]:
    """choice[j, i]: start block of the last group in an optimal split of the first i blocks
    into at most j groups (dp[j][0] = 0 lets earlier groups stay empty)."""
    nb = len(x)
    choice = np.zeros((m + 1, nb + 1), dtype=np.int64)
    prev = np.full(nb + 1, math.inf)
    prev[0] = 0.0
    for j in range(1, m + 1):
        cur = np.zeros(nb + 1)
        for i in range(1, nb + 1):
            vals = np.maximum(prev[:i], x[:i] * factors[cum[i] - cum[:i]])
            k = int(np.argmin(vals))
            cur[i], choice[j, i] = vals[k], k
        prev = cur
    return choice


def _reference_placement(
    blocks: Blocks, choice: npt.NDArray[np.int64], factors: npt.NDArray[np.float64], t: float
) -> Placement:
    groups: list[tuple[int, ...]] = []
    costs: list[float] = []
    i = len(blocks.lengths)
    for j in range(choice.shape[0] - 1, 0, -1):
        if i == 0:
            break
        k = int(choice[j, i])
        members = tuple(idx for b in range(k, i) for idx in blocks.members(b))
        groups.append(members)
        costs.append(blocks.lengths[k] * t * float(factors[len(members)]))
        i = k
    assert i == 0, "the reconstruction must consume every block"
    return Placement(
        makespan=max(costs, default=0.0),
        groups=tuple(reversed(groups)),
        group_makespans=tuple(reversed(costs)),
    )
