"""DPArrange (ARL-Tangram §4.2, Appendix B): give each scalable candidate one of its allowed
unit counts of a key resource so that the sum of their durations is least.

Both operators run Algorithm 3's recurrence "least total of tasks 1..i in state s" over a state
space that models the resource's topology:

* the unit pool (`dp_arrange`, the Basic DP Operator; CPU cores, API quota): the state is the
  number of units used, and a task taking k units moves j - k -> j;
* GPU chunks (`dp_arrange_chunks`, Algorithm 4): a task taking k GPUs (a power of two) holds one
  aligned chunk of k; the state counts the chunks taken of each size, like the paper's
  mixed-radix (a, b, c, d), and only states whose chunks pack into the free blocks are kept.

Both are exact for any durations, which need not fall as units grow: the answer is the least
over every reachable state, not the state that uses the whole budget. Ties go to fewer units.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce
from itertools import accumulate, chain
from numbers import Integral, Real
from operator import add, getitem
from typing import NamedTuple, Protocol, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt

from loom.core.errors import ConfigError

__all__ = [
    "Arrangement",
    "ChunkOperator",
    "DpOperator",
    "Durations",
    "PrefixArrangements",
    "UnitDurations",
    "UnitPoolOperator",
    "dp_arrange",
    "dp_arrange_chunks",
    "free_blocks",
    "pack_chunks",
]

Durations: TypeAlias = Sequence[Mapping[int, float]]
"""One mapping per task: each unit count (an int >= 1) it may take -> its duration (finite,
>= 0). Durations need not decrease as units grow."""

_Units: TypeAlias = npt.NDArray[np.int64]
_Floats: TypeAlias = npt.NDArray[np.float64]


class _Options(NamedTuple):
    """One task's choices: unit counts ascending, their durations, the least and most units."""

    units: _Units
    durations: _Floats
    low: int
    high: int


CapacityT = TypeVar("CapacityT", contravariant=True)


@dataclass(frozen=True, kw_only=True)
class Arrangement:
    """The unit count chosen for every task and the sum of the chosen durations."""

    total: float = field(metadata={"help": "sum of the chosen durations, added in task order"})
    units: tuple[int, ...] = field(metadata={"help": "units given to each task, in input order"})


class UnitDurations(Mapping[int, float]):
    """One task's durations (unit count -> duration), checked and sorted once, with its
    marginal savings when they qualify for the greedy path of `PrefixArrangements`. A scheduler
    arranges the same queued action on every pass: keeping one of these per action spares each
    pass re-validating its options and re-deriving its savings. Read-only; iterates ascending."""

    __slots__ = ("_gains", "_map", "_options", "_values")

    def __init__(self, durations: Mapping[int, float]) -> None:
        options = _plain_options(durations)
        if options is None:  # not plain ints to floats: the general check names what is wrong
            (options,) = _validated_options([durations])
        self._set(options, _task_savings(options))

    def _set(self, options: _Options, gains: _Floats | None) -> None:
        for shared in (options.units, options.durations, gains):
            if shared is not None:
                shared.flags.writeable = False  # every pass reads these arrays
        self._options = options
        self._gains = gains
        self._values: list[float] = options.durations.tolist()  # ascending counts
        self._map = dict(zip(options.units.tolist(), self._values, strict=True))

    @property
    def low(self) -> int:
        return self._options.low

    @property
    def high(self) -> int:
        return self._options.high

    def at_most(self, limit: int) -> UnitDurations | None:
        """The counts up to `limit` (this table itself when none is above); None when even the
        least is above it."""
        o = self._options
        if o.high <= limit:
            return self
        if o.low > limit:
            return None
        cut = UnitDurations.__new__(UnitDurations)
        kept = _at_most(o, limit)
        # A prefix of convex savings is convex; a cut may make other durations qualify.
        gains = _task_savings(kept) if self._gains is None else self._gains[: len(kept.units) - 1]
        cut._set(kept, gains)
        return cut

    def __getitem__(self, units: int) -> float:
        return self._map[units]

    def __iter__(self) -> Iterator[int]:
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._map)

    def __repr__(self) -> str:
        return f"UnitDurations({self._map!r})"


class DpOperator(Protocol[CapacityT]):
    """A key resource's DPArrange, given free capacity in that resource's own terms."""

    def arrange(self, durations: Durations, capacity: CapacityT, /) -> Arrangement | None:
        """The optimal arrangement, or None when the tasks' smallest demands cannot fit."""
        ...


@dataclass(frozen=True)
class UnitPoolOperator:
    """Interchangeable units (CPU cores of one node, API quota); capacity is the free count."""

    def arrange(self, durations: Durations, capacity: int, /) -> Arrangement | None:
        return dp_arrange(durations, capacity)


@dataclass(frozen=True, kw_only=True)
class ChunkOperator:
    """GPUs held in aligned power-of-two chunks; capacity is the sizes of the maximal free
    aligned blocks (`free_blocks`), which may come from several nodes."""

    gpus: int = field(default=8, metadata={"help": "GPUs per node, a power of two"})

    def __post_init__(self) -> None:
        _check_node(self.gpus)

    def arrange(self, durations: Durations, capacity: Sequence[int], /) -> Arrangement | None:
        return dp_arrange_chunks(durations, self.gpus, free=capacity)


# ---------------------------------------------------------------------------------------------
# Unit pool (Basic DP Operator)


def dp_arrange(durations: Durations, units: int) -> Arrangement | None:
    """Least-total arrangement using at most `units` units; None when the tasks' smallest unit
    counts exceed the budget. Zero tasks give an empty arrangement of total 0.0."""
    options = _validated_options(durations)
    budget = _check_count("unit budget", units)
    if not options:
        return Arrangement(total=0.0, units=())
    floor = sum(o.low for o in options)
    if floor > budget:
        return None
    ceiling = min(budget, sum(o.high for o in options))
    # A task can never take more than the budget less everyone else's minimum.
    options = [_at_most(o, ceiling - floor + o.low) for o in options]
    table = _UnitPoolTable.fill(options, ceiling)
    final = table.row(len(options))
    used = int(np.argmin(final))  # the first least total: the fewest units
    return Arrangement(total=float(final[used]), units=table.backtrack(options, used))


class PrefixArrangements:
    """`dp_arrange(durations[:k], units)` for every k from one table: greedy eviction drops the
    last candidate at each step, so it needs the optimum of every prefix. `total(k)` is O(1)
    after the fill; `arrangement(k)` backtracks only the prefix asked for.

    When every task takes any count in a range and its durations are convex in the count
    (marginal savings never grow, as under Amdahl-like elasticity), the optimum of a prefix is
    its minimums plus the largest positive marginal savings that the spare units buy: the
    separable convex resource-allocation problem, where greedy marginal allocation is exact
    (Gross 1956; Ibaraki and Katoh 1988). That path ranks the positive savings once (ties: the
    earlier task first) and answers each prefix by the first of them that belong to it, instead
    of filling the DP table; other inputs take the table. Tasks given as `UnitDurations` skip
    re-validation and bring their savings with them."""

    def __init__(self, durations: Durations, units: int) -> None:
        budget = _check_count("unit budget", units)
        tables = [t for t in durations if isinstance(t, UnitDurations)]
        cached = len(tables) == len(durations)  # validated already, savings known
        if cached:
            # A task whose least is above the budget stays whole: it ends the feasible prefix.
            tables = [
                t if t._options.high <= budget or (c := t.at_most(budget)) is None else c
                for t in tables
            ]
            self._options = [t._options for t in tables]
        else:
            options = _validated_options(durations)
            self._options = [_at_most(o, budget) if o.low <= budget else o for o in options]
        self._budget = budget
        self.feasible = 0  # the longest prefix whose minimums fit the budget
        floor = 0
        for o in self._options:
            floor += o.low
            if floor > budget:
                break
            self.feasible += 1
        fit = self._options[: self.feasible]
        self._table: _UnitPoolTable | None = None
        self._savings: _RankedSavings | None = None
        savings: tuple[_Floats, list[int]] | None = None
        if not fit:
            pass
        elif not cached:
            savings = _convex_savings(fit)
        elif all(t._gains is not None for t in tables[: self.feasible]):
            gains = [t._gains for t in tables[: self.feasible] if t._gains is not None]
            savings = (np.concatenate(gains), [len(g) for g in gains])
        if savings is not None:
            values = (
                [t._values for t in tables[: self.feasible]]
                if cached
                else [o.durations.tolist() for o in fit]
            )
            self._savings = _RankedSavings(fit, *savings, values)
        elif fit:
            self._table = _UnitPoolTable.fill(fit, budget, reserve=False)
        self._used = (
            [0] + [int(np.argmin(self._table.row(k))) for k in range(1, self.feasible + 1)]
            if self._table is not None
            else [0]
        )
        self._greedy: dict[int, Arrangement] = {}

    def __len__(self) -> int:
        return len(self._options) + 1

    def total(self, k: int) -> float | None:
        if k > self.feasible:
            return None
        if k == 0:
            return 0.0
        if self._savings is not None:
            return self._greedy_prefix(k).total
        assert self._table is not None
        return float(self._table.row(k)[self._used[k]])

    def arrangement(self, k: int) -> Arrangement | None:
        if k > self.feasible:
            return None
        if k == 0:
            return Arrangement(total=0.0, units=())
        if self._savings is not None:
            return self._greedy_prefix(k)
        total = self.total(k)
        assert self._table is not None and total is not None
        units = self._table.backtrack(self._options[:k], self._used[k])
        return Arrangement(total=total, units=units)

    def _greedy_prefix(self, k: int) -> Arrangement:
        got = self._greedy.get(k)
        if got is None:
            assert self._savings is not None
            got = self._savings.prefix(k, self._budget)
            self._greedy[k] = got
        return got


class _RankedSavings:
    """The greedy path over tasks 0..n-1, each convex over a range of counts (`gains`: their
    marginal savings, task by task, `counts` of them each; `durations[i][e]`: task i's duration
    at its least count plus e).

    Each prefix takes the first of its tasks' positive savings in one ranking: largest first,
    ties to the earlier task (within a task, to the smaller count, which convexity ranks first
    anyway). Only the head of that ranking is sorted, the savings at least as large as the m-th
    largest (a partition, not a sort of them all); a prefix that needs more than the head holds
    ranks a head four times as long."""

    def __init__(
        self,
        options: list[_Options],
        gains: _Floats,
        counts: list[int],
        durations: list[list[float]],
    ) -> None:
        self._gains = gains
        self._ends = np.array(list(accumulate(counts)), dtype=np.intp)  # task i's end in gains
        self._lows = [o.low for o in options]
        self._floors = list(accumulate(self._lows, initial=0))
        self._durations = durations
        self._head: npt.NDArray[np.intp] = np.zeros(0, dtype=np.intp)  # tasks of the savings
        self._size = 0  # m: the head holds every saving >= the m-th largest (and > 0)
        self._complete = False  # the head holds every positive saving
        self._widest = max(counts)

    def _rank(self, m: int) -> None:
        g = self._gains
        n = len(g)
        cut = float(np.partition(g, n - m)[n - m]) if m < n else 0.0
        if cut > 0:
            picked = np.flatnonzero(g >= cut)
        else:
            picked, self._complete = np.flatnonzero(g > 0), True
        ranked = picked[np.argsort(-g[picked], kind="stable")]
        self._head = np.searchsorted(self._ends, ranked, side="right")
        self._size = m

    def prefix(self, k: int, budget: int) -> Arrangement:
        """The optimum of the first k tasks (their minimums fit `budget`): the `spare` largest
        positive savings among theirs."""
        spare = budget - self._floors[k]
        if not self._size:  # room for this prefix and a few evictions after it
            self._rank(spare + 4 * self._widest + 32)
        while True:
            mine = self._head if k == len(self._lows) else self._head[self._head < k]
            if len(mine) >= spare or self._complete:
                break
            self._rank(4 * self._size)
        extra = np.bincount(mine[:spare], minlength=k).tolist()
        # Added in task order, one by one, as the DP table adds them.
        total = reduce(add, map(getitem, self._durations[:k], extra), 0.0)
        return Arrangement(total=total, units=tuple(map(add, self._lows[:k], extra)))


def _task_savings(options: _Options) -> _Floats | None:
    """One task's marginal savings (duration at u units less at u + 1), or None unless it takes
    every count from its least to its most and no extra unit saves more than the one before:
    `_convex_savings` for a single task."""
    if options.high - options.low != len(options.units) - 1:
        return None
    gains = options.durations[:-1] - options.durations[1:]
    return None if bool((gains[1:] > gains[:-1]).any()) else gains


def _convex_savings(options: list[_Options]) -> tuple[_Floats, list[int]] | None:
    """Every task's marginal savings (duration at u units less at u + 1), concatenated in
    task order, and their count per task; None unless every task takes every count from its
    least to its most and no extra unit saves more than the one before (one vectorised pass)."""
    counts = [len(o.units) - 1 for o in options]
    if any(o.high - o.low != c for o, c in zip(options, counts, strict=True)):
        return None
    durations = np.concatenate([o.durations for o in options])
    steps = durations[:-1] - durations[1:]
    starts = np.cumsum([0] + [c + 1 for c in counts])[:-1]
    keep = np.ones(len(steps), dtype=bool)
    keep[starts[1:] - 1] = False  # the step from one task's last option to the next's first
    gains = steps[keep]
    rising = gains[1:] > gains[:-1]
    first = np.cumsum([0, *counts])[1:-1]  # where each later task's savings begin
    rising[first[(first > 0) & (first <= len(rising))] - 1] = False  # ...after another's
    return None if rising.any() else (gains, counts)


def _at_most(options: _Options, limit: int) -> _Options:
    if options.high <= limit:
        return options
    keep = options.units <= limit
    units = options.units[keep]
    return _Options(units, options.durations[keep], options.low, int(units[-1]))


@dataclass(frozen=True)
class _UnitPoolTable:
    """best[i, pad + j]: least total of the first i tasks using exactly j units; inf where no
    choice uses j, where j leaves too few units for the tasks after i, and in the pad columns."""

    best: _Floats
    pad: int

    @classmethod
    def fill(cls, options: list[_Options], ceiling: int, *, reserve: bool = True) -> _UnitPoolTable:
        """`reserve`: leave room for the later tasks' minimums (needed for the full set only;
        without it, every row i is the exact table of the prefix of i tasks)."""
        pad = max(o.high for o in options)
        lows = np.cumsum([0] + [o.low for o in options]).tolist()
        highs = np.cumsum([0] + [o.high for o in options])
        room = ceiling - (lows[-1] - np.array(lows)) if reserve else ceiling
        highs = np.minimum(highs, room).tolist()
        best = np.full((len(options) + 1, pad + ceiling + 1), np.inf)
        best[0, pad] = 0.0
        # NOTE: window[i, t, j] = best[i, t + j], so row pad - k of window[i] is best[i, j - k]
        # for every j at once. One strided view serves every task, which then costs a gather (a
        # slice when its unit counts are consecutive), an add and a column-wise min.
        window = np.lib.stride_tricks.sliding_window_view(best, ceiling + 1, axis=1)
        for i, (ks, ds, low, high) in enumerate(options):
            lo, hi = lows[i + 1], highs[i + 1] + 1
            if high - low + 1 == len(ks):
                candidates = window[i, pad - high : pad - low + 1, lo:hi] + ds[::-1, None]
            else:
                candidates = window[i, pad - ks, lo:hi] + ds[:, None]
            np.minimum.reduce(candidates, axis=0, out=best[i + 1, pad + lo : pad + hi])
        return cls(best, pad)

    def row(self, i: int) -> _Floats:
        return self.best[i, self.pad :]

    def backtrack(self, options: list[_Options], used: int) -> tuple[int, ...]:
        """Each task's units on a least path to `used` units, the fewest among exact ties: the
        sums are recomputed with the same float operations that filled the table."""
        flat, width = self.best.ravel(), self.best.shape[1]
        picks: list[int] = []
        for i in range(len(options) - 1, -1, -1):
            ks, ds, _, _ = options[i]
            k = int(ks[(flat[i * width + self.pad + used - ks] + ds).argmin()])
            picks.append(k)
            used -= k
        assert used == 0, f"backtracking ended at {used} units, not 0"
        return tuple(reversed(picks))


# ---------------------------------------------------------------------------------------------
# GPU chunks (Algorithm 4)


def dp_arrange_chunks(
    durations: Durations, gpus: int, *, free: Sequence[int] | None = None
) -> Arrangement | None:
    """Least-total arrangement where each task takes one aligned chunk of a power-of-two GPU
    count; None when no choice packs. `gpus` is the GPUs per node (a power of two); `free` is the
    sizes of the maximal free aligned blocks (`free_blocks` of each node), default one idle node.

    NOTE: chunks of power-of-two sizes pack into disjoint maximal aligned free blocks iff, for
    every size s, the chunks of size >= s total at most the free GPUs in blocks of size >= s.
    Necessary, as a chunk of s lies inside one block of >= s. Sufficient: place the largest
    chunks first into any block that holds them, splitting buddy-style; every split leaves pieces
    no smaller than the chunk just placed, so the room in blocks >= s falls by exactly what was
    placed. For one idle node this is "sum <= gpus": the unit pool over power-of-two options,
    which the tests check along with explicit aligned packing.
    """
    levels = _check_node(gpus)
    blocks = (gpus,) if free is None else tuple(_check_chunk("free block", b, gpus) for b in free)
    options = _validated_options(durations)
    for i, o in enumerate(options):
        for k in o.units.tolist():
            _check_chunk(f"task {i}: unit count", k, gpus)
    if not options:
        return Arrangement(total=0.0, units=())
    space = _ChunkSpace.build(options, blocks, levels)
    best, choice = space.fill(options)
    top = float(best.min())
    if not math.isfinite(top):
        return None
    ties = np.flatnonzero(best == top)
    state = int(ties[np.argmin(space.used[ties])])  # fewest GPUs, then the first state
    return Arrangement(total=top, units=space.backtrack(options, choice, state))


@dataclass(frozen=True)
class _ChunkSpace:
    """The packable states of Algorithm 4, numbered 0..n-1 (0: no chunk taken). A state counts
    the chunks taken of each size 2**l; prev[l, v] is state v less one chunk of 2**l, or the
    sentinel n (whose total stays inf) when v holds none."""

    prev: npt.NDArray[np.intp]
    used: _Units  # GPUs in each state's chunks
    level: npt.NDArray[np.intp]  # level[2**l] = l

    @classmethod
    def build(cls, options: list[_Options], blocks: Sequence[int], levels: int) -> _ChunkSpace:
        sizes = [1 << level for level in range(levels + 1)]
        room = [sum(b for b in blocks if b >= s) for s in sizes]
        offered = [sum(1 for o in options if s in o.units) for s in sizes]
        dims = [min(r // s, n) + 1 for r, s, n in zip(room, sizes, offered, strict=True)]
        counts = np.ogrid[tuple(slice(0, d) for d in dims)]
        valid: npt.NDArray[np.bool_] = np.ones(dims, dtype=bool)
        at_least: _Units = np.zeros(dims, dtype=np.int64)  # GPUs in chunks of >= 2**level
        for level in range(levels, -1, -1):
            at_least = at_least + counts[level] * sizes[level]
            valid &= at_least <= room[level]
        cells = np.flatnonzero(valid)  # ascending, so the empty state comes first
        number = np.full(valid.size + 1, len(cells), dtype=np.intp)
        number[cells] = np.arange(len(cells))
        strides = np.cumprod([1, *dims[:0:-1]])[::-1]  # C order: the last axis is contiguous
        taken = np.stack(np.unravel_index(cells, dims))
        prev = np.where(taken > 0, number[cells - strides[:, None]], len(cells))
        level_of = np.zeros(sizes[-1] + 1, dtype=np.intp)
        level_of[sizes] = np.arange(levels + 1)
        return cls(prev, at_least.ravel()[cells], level_of)

    def fill(self, options: list[_Options]) -> tuple[_Floats, list[npt.NDArray[np.intp]]]:
        """best[v]: least total of all tasks ending in state v; choice[i][v]: the option index
        task i takes on the best way to v (the first, so the fewest GPUs, on ties)."""
        n = self.prev.shape[1]
        best = np.full(n + 1, np.inf)
        best[0] = 0.0
        choice: list[npt.NDArray[np.intp]] = []
        for ks, ds, _, _ in options:
            candidates = best[self.prev[self.level[ks]]] + ds[:, None]
            choice.append(candidates.argmin(axis=0))
            np.minimum.reduce(candidates, axis=0, out=best[:n])
        return best[:n], choice

    def backtrack(
        self, options: list[_Options], choice: list[npt.NDArray[np.intp]], state: int
    ) -> tuple[int, ...]:
        picks: list[int] = []
        for i in range(len(options) - 1, -1, -1):
            k = int(options[i].units[choice[i][state]])
            picks.append(k)
            state = int(self.prev[self.level[k], state])
        assert state == 0, f"backtracking ended in state {state}, not the empty one"
        return tuple(reversed(picks))


def free_blocks(gpus: int, occupied: Collection[int] = ()) -> list[tuple[int, int]]:
    """The maximal free aligned blocks of one node as (start, size), by start; `occupied` lists
    the busy GPU indices. Their sizes are the `free` of `dp_arrange_chunks`."""
    _check_node(gpus)
    busy = set(occupied)
    for g in busy:
        if isinstance(g, bool) or not isinstance(g, Integral) or not 0 <= g < gpus:
            raise ConfigError(f"occupied GPU {g!r} is not an index in [0, {gpus})")
    blocks: list[tuple[int, int]] = []
    stack = [(0, gpus)]
    while stack:
        start, size = stack.pop()
        if busy.isdisjoint(range(start, start + size)):
            blocks.append((start, size))
        elif size > 1:
            half = size // 2
            stack += [(start + half, half), (start, half)]
    return blocks


def pack_chunks(
    sizes: Sequence[int], gpus: int, *, occupied: Collection[int] = ()
) -> list[int] | None:
    """Aligned start offsets on one node for chunks of the given power-of-two sizes, one per
    size in input order, or None when they do not pack around the `occupied` GPUs. Chunks are
    placed largest first (then by input order), each into the smallest free block that holds it
    (lowest start on ties), which is split buddy-style; this packs whenever any packing exists."""
    _check_node(gpus)
    for i, s in enumerate(sizes):
        _check_chunk(f"chunk {i}", s, gpus)
    free = free_blocks(gpus, occupied)
    offsets = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        holding = [b for b in free if b[1] >= sizes[i]]
        if not holding:
            return None
        start, size = min(holding, key=lambda b: (b[1], b[0]))
        free.remove((start, size))
        offsets[i] = start
        piece = sizes[i]
        while piece < size:  # buddies left over: [start+s, start+2s), [start+2s, start+4s), ...
            free.append((start + piece, piece))
            piece *= 2
    return offsets


# ---------------------------------------------------------------------------------------------
# Validation


def _validated_options(durations: Durations) -> list[_Options]:
    """Each task's options, checked and sorted in one vectorised pass over all of them (or
    taken as they are from `UnitDurations`, checked when built)."""
    tables = [t for t in durations if isinstance(t, UnitDurations)]
    if tables and len(tables) == len(durations):
        return [t._options for t in tables]
    sizes = [len(task) for task in durations]
    if 0 in sizes:
        raise ConfigError(f"task {sizes.index(0)} lists no unit counts to choose from")
    if not sizes:
        return []
    try:
        ks = np.array(list(chain.from_iterable(durations)))
        values = chain.from_iterable(t.values() for t in durations)
        ds = np.fromiter(values, dtype=np.float64, count=sum(sizes))
    except (TypeError, ValueError, OverflowError):
        raise _invalid_options(durations) from None
    if (
        ks.dtype.kind not in "iu"
        or ks.min() < 1
        or ks.max() > np.iinfo(np.int64).max
        or not (np.isfinite(ds).all() and ds.min() >= 0)
    ):
        raise _invalid_options(durations)
    ks = ks.astype(np.int64, copy=False)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    rises = ks[1:] > ks[:-1]
    rises[ends[:-1] - 1] = True  # a task boundary is no descent
    if not rises.all():
        order = np.lexsort((ks, np.repeat(np.arange(len(sizes)), sizes)))
        ks, ds = ks[order], ds[order]
    lows, highs = ks[starts].tolist(), ks[ends - 1].tolist()
    return [
        _Options(ks[a:b], ds[a:b], low, high)
        for a, b, low, high in zip(starts.tolist(), ends.tolist(), lows, highs, strict=True)
    ]


def _plain_options(durations: Mapping[int, float]) -> _Options | None:
    """One task's options when its counts are ints >= 1 and its durations finite floats >= 0
    (what `_validated_options` accepts, checked without its vectorised set-up, which costs more
    than the check for one task); None for anything else, including any bad option."""
    ks, ds = list(durations), list(durations.values())
    if not ks or set(map(type, ks)) != {int} or set(map(type, ds)) != {float}:
        return None
    if not (sum(ds) < math.inf and min(ds) >= 0.0):  # a NaN or inf makes the sum fail
        return None
    if ks != sorted(ks):
        order = sorted(range(len(ks)), key=ks.__getitem__)
        ks, ds = [ks[i] for i in order], [ds[i] for i in order]
    if ks[0] < 1 or ks[-1] > _INT64_MAX:
        return None
    return _Options(np.array(ks, dtype=np.int64), np.array(ds), ks[0], ks[-1])


_INT64_MAX = int(np.iinfo(np.int64).max)


def _invalid_options(durations: Durations) -> ConfigError:
    """The error naming the first bad option (the slow path, taken only on bad input)."""
    for task, options in enumerate(durations):
        for k, d in options.items():
            if isinstance(k, bool) or not isinstance(k, Integral) or k < 1:
                return ConfigError(f"task {task}: unit counts must be integers >= 1, got {k!r}")
            if not (isinstance(d, Real) and math.isfinite(d) and d >= 0):
                return ConfigError(
                    f"task {task}: the duration for {k} units must be finite and >= 0, got {d!r}"
                )
    return ConfigError("unit counts must fit in a 64-bit integer")


def _check_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


def _check_node(gpus: int) -> int:
    """log2 of a node's GPU count, which must be a power of two."""
    if isinstance(gpus, bool) or not isinstance(gpus, Integral) or gpus < 1 or gpus & (gpus - 1):
        raise ConfigError(f"GPUs per node must be a power of two >= 1, got {gpus!r}")
    return int(gpus).bit_length() - 1


def _check_chunk(name: str, size: int, gpus: int) -> int:
    if isinstance(size, bool) or not isinstance(size, Integral) or size < 1 or size & (size - 1):
        raise ConfigError(f"{name} must be a power of two >= 1, got {size!r}")
    if size > gpus:
        raise ConfigError(f"{name} is {size} GPUs, more than a node's {gpus}")
    return int(size)
