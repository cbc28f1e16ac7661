"""Heddle's trajectory-adaptive resource manager (§6.2, Algorithm 2): split a GPU budget into
workers of model-parallel degrees, sorted descending, and place trajectories on them exactly;
sort-initialised simulated annealing searches the degree multiset.

An allocation is the descending tuple of worker degrees; worker j of degree d costs
``worker_cost(d)`` and receives the j-th longest contiguous group (`PresortedPlacer`).
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from loom.core.errors import ConfigError
from loom.rollout.heddle.placement import Lengths, Placement, PresortedPlacer, WorkerCost

__all__ = [
    "DEFAULT_DEGREES",
    "Allocation",
    "Unsplittable",
    "WorkerCostModel",
    "anneal_allocation",
    "exhaustive_allocation",
    "homogeneous_allocation",
]

WorkerCostModel = Callable[[int], WorkerCost]
"""Cost of one worker as a function of its model-parallel degree (GPUs)."""

DEFAULT_DEGREES = (1, 2, 4, 8)
_Alloc = tuple[int, ...]


class Unsplittable(ConfigError):
    """The GPUs cannot be split into workers of the allowed degrees."""


@dataclass(frozen=True, kw_only=True)
class Allocation:
    """A GPU split into workers and the placement of trajectories on them."""

    degrees: tuple[int, ...] = field(metadata={"help": "worker degrees, sorted descending"})
    placement: Placement = field(metadata={"help": "groups aligned with degrees (may be empty)"})
    makespan: float = field(metadata={"help": "Formula 2 makespan of placement"})
    iterations: int = field(metadata={"help": "search steps taken (proposals or enumerated)"})
    evaluations: int = field(metadata={"help": "distinct allocations placed (cache misses)"})


class _Scorer:
    """Memoised exact placement of allocations on one set of trajectories."""

    def __init__(self, lengths: Lengths, worker_cost: WorkerCostModel, degrees: Sequence[int]):
        self._placer = PresortedPlacer(lengths)
        self._costs = {d: _worker_cost(worker_cost, d) for d in degrees}
        self._memo: dict[_Alloc, Placement] = {}

    @property
    def evaluations(self) -> int:
        return len(self._memo)

    def __call__(self, alloc: _Alloc) -> Placement:
        hit = self._memo.get(alloc)
        if hit is None:
            hit = self._placer.solve([self._costs[d] for d in alloc])
            self._memo[alloc] = hit
        return hit


def _worker_cost(worker_cost: WorkerCostModel, degree: int) -> WorkerCost:
    cost = worker_cost(degree)
    if not isinstance(cost, WorkerCost):
        raise ConfigError(f"worker_cost({degree}) must return a WorkerCost, got {cost!r}")
    return cost


# ---------------------------------------------------------------------------------------------
# Validation


def _positive_int(value: int, what: str) -> int:
    try:
        v = operator.index(value)
    except TypeError:
        raise ConfigError(f"{what} must be an integer, got {value!r}") from None
    if v < 1:
        raise ConfigError(f"{what} must be >= 1, got {v}")
    return v


def _check_degrees(degrees: Sequence[int]) -> tuple[int, ...]:
    """Distinct allowed degrees, ascending."""
    out = tuple(sorted({_positive_int(d, "every degree") for d in degrees}))
    if not out:
        raise ConfigError("degrees must name at least one model-parallel degree")
    return out


def _representable(total: int, degrees: tuple[int, ...]) -> list[bool]:
    """rep[r]: r GPUs split exactly into workers of the given degrees."""
    rep = [True] + [False] * total
    for r in range(1, total + 1):
        rep[r] = any(d <= r and rep[r - d] for d in degrees)
    return rep


def _check_schedule(cooling: float, epsilon: float | None, max_iters: int) -> None:
    if not 0 < cooling < 1:
        raise ConfigError(f"cooling must be in (0, 1), got {cooling!r}")
    if epsilon is not None and not (math.isfinite(epsilon) and epsilon > 0):
        raise ConfigError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if operator.index(max_iters) < 0:
        raise ConfigError(f"max_iters must be >= 0, got {max_iters!r}")


# ---------------------------------------------------------------------------------------------
# Initial state and perturbations


def _sample_initial(
    total: int, degrees: tuple[int, ...], rep: list[bool], rng: np.random.Generator
) -> _Alloc:
    """Sample degrees until they sum to total exactly (only choices that keep the rest
    representable, so no repair is ever needed), sorted descending."""
    out: list[int] = []
    rem = total
    while rem > 0:
        choices = [d for d in degrees if d <= rem and rep[rem - d]]
        d = choices[int(rng.integers(len(choices)))]
        out.append(d)
        rem -= d
    return tuple(sorted(out, reverse=True))


def _redistributions(counts: Counter[int], allowed: frozenset[int]) -> list[tuple[int, int, int]]:
    """Move k GPUs from a worker of degree a to one of degree b; both stay allowed."""
    opts: list[tuple[int, int, int]] = []
    for a in sorted(counts):
        for b in sorted(counts):
            if a == b and counts[a] < 2:
                continue
            opts.extend((a, b, k) for k in range(1, a) if a - k in allowed and b + k in allowed)
    return opts


def _moves(state: _Alloc, allowed: frozenset[int]) -> list[list[tuple[_Alloc, _Alloc]]]:
    """Per kind (redistribute, split, merge), its moves as (removed, added) degrees."""
    counts = Counter(state)
    present = sorted(counts)
    redistribute: list[tuple[_Alloc, _Alloc]] = [
        ((a, b), (a - k, b + k)) for a, b, k in _redistributions(counts, allowed)
    ]
    split: list[tuple[_Alloc, _Alloc]] = [
        ((d,), (d // 2, d // 2)) for d in present if d % 2 == 0 and d // 2 in allowed
    ]
    merge: list[tuple[_Alloc, _Alloc]] = [
        ((d, d), (2 * d,)) for d in present if counts[d] >= 2 and 2 * d in allowed
    ]
    return [kind for kind in (redistribute, split, merge) if kind]


def _perturb(state: _Alloc, allowed: frozenset[int], rng: np.random.Generator) -> _Alloc | None:
    """A random neighbour: a kind uniformly among those possible, then one of its moves."""
    kinds = _moves(state, allowed)
    if not kinds:
        return None
    kind = kinds[int(rng.integers(len(kinds)))]
    removed, added = kind[int(rng.integers(len(kind)))]
    counts = Counter(state)
    counts.subtract(removed)
    counts.update(added)
    return tuple(sorted(counts.elements(), reverse=True))


def _accept(delta: float, temperature: float, rng: np.random.Generator) -> bool:
    """Metropolis rule."""
    return delta < 0 or float(rng.random()) < math.exp(-delta / temperature)


# ---------------------------------------------------------------------------------------------
# Public searches


def anneal_allocation(
    lengths: Lengths,
    total_gpus: int,
    worker_cost: WorkerCostModel,
    degrees: Sequence[int] = DEFAULT_DEGREES,
    *,
    seed: int = 0,
    cooling: float = 0.95,
    epsilon: float | None = None,
    max_iters: int = 10_000,
) -> Allocation:
    """Sort-initialised simulated annealing over degree multisets summing to total_gpus.

    The temperature starts at the initial makespan and cools geometrically by `cooling` until it
    drops to `epsilon` (default 1e-3 × the initial makespan) or `max_iters` steps. Deterministic
    for a given seed; scores of allocations already seen are memoised.
    """
    allowed, total = _check_degrees(degrees), _positive_int(total_gpus, "total_gpus")
    _check_schedule(cooling, epsilon, max_iters)
    rep = _representable(total, allowed)
    if not rep[total]:
        raise Unsplittable(f"total_gpus={total} is not a sum of degrees {allowed}")
    rng = np.random.default_rng(seed)
    score = _Scorer(lengths, worker_cost, allowed)
    state = _sample_initial(total, allowed, rep, rng)
    best, iterations = _anneal(state, score, frozenset(allowed), rng, (cooling, epsilon, max_iters))
    return _allocation(best, score(best), iterations, score.evaluations)


def _anneal(
    state: _Alloc,
    score: _Scorer,
    allowed: frozenset[int],
    rng: np.random.Generator,
    schedule: tuple[float, float | None, int],
) -> tuple[_Alloc, int]:
    """Algorithm 2's loop; returns the best allocation seen and the number of steps."""
    cooling, epsilon, max_iters = schedule
    cost = score(state).makespan
    best, best_cost = state, cost
    temperature = cost
    floor = 1e-3 * cost if epsilon is None else epsilon
    iterations = 0
    while temperature > floor and iterations < max_iters:
        candidate = _perturb(state, allowed, rng)
        if candidate is None:
            break
        new_cost = score(candidate).makespan
        if _accept(new_cost - cost, temperature, rng):
            state, cost = candidate, new_cost
            if cost < best_cost:
                best, best_cost = state, cost
        temperature *= cooling
        iterations += 1
    return best, iterations


def _allocation(degrees: _Alloc, placement: Placement, iterations: int, evals: int) -> Allocation:
    return Allocation(
        degrees=degrees,
        placement=placement,
        makespan=placement.makespan,
        iterations=iterations,
        evaluations=evals,
    )


def homogeneous_allocation(
    lengths: Lengths, total_gpus: int, worker_cost: WorkerCostModel, degree: int
) -> Allocation:
    """Every worker has the same degree (the Fix-d baselines); degree must divide total_gpus."""
    total, d = _positive_int(total_gpus, "total_gpus"), _positive_int(degree, "degree")
    if total % d:
        raise ConfigError(f"degree {d} does not divide total_gpus={total}")
    alloc = (d,) * (total // d)
    score = _Scorer(lengths, worker_cost, (d,))
    return _allocation(alloc, score(alloc), 0, score.evaluations)


def _multisets(total: int, degrees_desc: tuple[int, ...]) -> Iterator[_Alloc]:
    """All descending tuples of degrees summing to total."""
    if total == 0:
        yield ()
        return
    for i, d in enumerate(degrees_desc):
        if d <= total:
            for rest in _multisets(total - d, degrees_desc[i:]):
                yield (d, *rest)


def exhaustive_allocation(
    lengths: Lengths,
    total_gpus: int,
    worker_cost: WorkerCostModel,
    degrees: Sequence[int] = DEFAULT_DEGREES,
) -> Allocation:
    """The optimum over every degree multiset summing to total_gpus (small instances only);
    ties go to the first in descending lexicographic order."""
    allowed, total = _check_degrees(degrees), _positive_int(total_gpus, "total_gpus")
    score = _Scorer(lengths, worker_cost, allowed)
    best: _Alloc | None = None
    count = 0
    for alloc in _multisets(total, tuple(reversed(allowed))):
        count += 1
        if best is None or score(alloc).makespan < score(best).makespan:
            best = alloc
    if best is None:
        raise Unsplittable(f"total_gpus={total} is not a sum of degrees {allowed}")
    return _allocation(best, score(best), count, score.evaluations)
