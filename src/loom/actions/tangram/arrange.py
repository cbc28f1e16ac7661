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
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from numbers import Integral, Real
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
    (Gross 1956; Ibaraki and Katoh 1988). That path answers each prefix by one partial sort of
    the savings instead of filling the DP table; other inputs take the table."""

    def __init__(self, durations: Durations, units: int) -> None:
        options = _validated_options(durations)
        budget = _check_count("unit budget", units)
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
        self._savings: tuple[_Floats, _Units, list[int], list[int]] | None = None
        savings = _convex_savings(fit) if fit else None
        if savings is not None:
            gains, counts = savings
            owner = np.repeat(np.arange(len(fit)), counts)
            ends = np.cumsum([0, *counts]).tolist()
            floors = np.cumsum([0] + [o.low for o in fit]).tolist()
            self._savings = (gains, owner, ends, floors)
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
        if k not in self._greedy:
            assert self._savings is not None
            gains, owner, ends, floors = self._savings
            g, spare = gains[: ends[k]], self._budget - floors[k]
            positive = np.flatnonzero(g > 0)
            if len(positive) > spare:  # the `spare` largest savings (all positive)
                positive = np.argpartition(-g, spare - 1)[:spare] if spare > 0 else positive[:0]
            extra = np.bincount(owner[positive], minlength=k).tolist()
            opts = self._options[:k]
            # Summed in task order, as the DP table adds them.
            total = sum(float(o.durations[e]) for o, e in zip(opts, extra, strict=True))
            units = tuple(o.low + e for o, e in zip(opts, extra, strict=True))
            self._greedy[k] = Arrangement(total=total, units=units)
        return self._greedy[k]


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
    """Each task's options, checked and sorted in one vectorised pass over all of them."""
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
