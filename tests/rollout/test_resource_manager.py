"""Heddle resource manager: annealing over degree multisets against exhaustive search."""

from __future__ import annotations

import numpy as np
import pytest

from loom.core.errors import ConfigError
from loom.rollout.heddle.placement import WorkerCost, presorted_dp
from loom.rollout.heddle.resource_manager import (
    Allocation,
    WorkerCostModel,
    anneal_allocation,
    exhaustive_allocation,
    homogeneous_allocation,
)


def cost_model(speedup: float = 0.6, contention: float = 0.05, relief: float = 0.5):
    """Degree d: per-token time d^-speedup, interference 1 + contention·k / d^relief."""

    def worker_cost(d: int) -> WorkerCost:
        return WorkerCost(d**-speedup, lambda k: 1 + contention * k / d**relief)

    return worker_cost


def make_lengths(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(6, 1, n)


def check_allocation(a: Allocation, lengths, total: int, allowed, worker_cost: WorkerCostModel):
    assert sum(a.degrees) == total
    assert list(a.degrees) == sorted(a.degrees, reverse=True)
    assert set(a.degrees) <= set(allowed)
    assert len(a.placement.groups) == len(a.degrees)
    assert sorted(i for g in a.placement.groups for i in g) == list(range(len(lengths)))
    costs = [worker_cost(d) for d in a.degrees]
    recomputed = max(
        max(lengths[i] for i in g) * c.token_time * c.interference(len(g))
        for g, c in zip(a.placement.groups, costs, strict=True)
        if g
    )
    assert a.makespan == a.placement.makespan == recomputed


INSTANCES = [
    # (n, total GPUs, cost-model parameters)
    (60, 8, (0.6, 0.05, 0.5)),
    (120, 16, (0.6, 0.05, 0.5)),
    (80, 12, (0.5, 0.1, 0.3)),
    (150, 16, (0.5, 0.1, 0.3)),
    (100, 16, (0.8, 0.02, 0.9)),
    (40, 10, (0.4, 0.2, 0.1)),
]


@pytest.mark.parametrize(("n", "total", "params"), INSTANCES)
def test_annealing_reaches_the_exhaustive_optimum(n, total, params):
    lengths, worker_cost = make_lengths(n, seed=n + total), cost_model(*params)
    best = exhaustive_allocation(lengths, total, worker_cost)
    check_allocation(best, lengths, total, (1, 2, 4, 8), worker_cost)
    for seed in range(5):
        found = anneal_allocation(lengths, total, worker_cost, seed=seed)
        check_allocation(found, lengths, total, (1, 2, 4, 8), worker_cost)
        assert found.makespan == best.makespan


def test_annealing_is_deterministic_under_a_seed():
    lengths, worker_cost = make_lengths(500, seed=3), cost_model(0.5, 0.1, 0.3)
    runs = [anneal_allocation(lengths, 32, worker_cost, seed=11) for _ in range(2)]
    assert runs[0] == runs[1]
    assert runs[0].iterations == 135  # ceil(log(1e-3) / log(0.95)) steps of cooling
    assert 1 <= runs[0].evaluations <= runs[0].iterations + 1


def test_exhaustive_enumerates_binary_partitions():
    # Partitions of 8 into parts {1, 2, 4, 8}: the binary partitions b(8) = 10.
    a = exhaustive_allocation([5.0, 1.0], 8, cost_model())
    assert a.iterations == 10 and a.evaluations == 10


def test_homogeneous_allocation_matches_presorted_dp():
    lengths, worker_cost = make_lengths(300, seed=1), cost_model()
    for d in (1, 2, 4, 8):
        a = homogeneous_allocation(lengths, 16, worker_cost, d)
        assert a.degrees == (d,) * (16 // d)
        cost = worker_cost(d)
        expected = presorted_dp(lengths, 16 // d, cost.interference, cost.token_time)
        assert a.makespan == expected.makespan


def test_homogeneous_degree_must_divide_total():
    with pytest.raises(ConfigError, match="does not divide"):
        homogeneous_allocation([1.0], 12, cost_model(), 8)


def test_no_moves_and_zero_lengths_stop_at_once():
    assert anneal_allocation([3.0, 1.0], 8, cost_model(), degrees=(8,)).iterations == 0
    zero = anneal_allocation([0.0, 0.0], 8, cost_model())
    assert zero.makespan == 0.0 and zero.iterations == 0


def test_epsilon_and_max_iters_bound_the_search():
    lengths = make_lengths(50, seed=2)
    assert anneal_allocation(lengths, 16, cost_model(), max_iters=7).iterations == 7
    short = anneal_allocation(lengths, 16, cost_model(), epsilon=1e9)
    assert short.iterations == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"total_gpus": 7, "degrees": (2, 4)}, "not a sum of degrees"),
        ({"total_gpus": 0}, "total_gpus must be >= 1"),
        ({"degrees": (0, 2)}, "every degree must be >= 1"),
        ({"degrees": ()}, "at least one"),
        ({"cooling": 1.0}, "cooling"),
        ({"epsilon": -1.0}, "epsilon"),
        ({"worker_cost": lambda d: d}, "must return a WorkerCost"),
    ],
)
def test_bad_input_raises_config_error(kwargs, match):
    args = {"lengths": [3.0, 1.0], "total_gpus": 8, "worker_cost": cost_model()}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        anneal_allocation(**args)
