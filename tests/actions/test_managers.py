"""Resource managers: exclusive cores, NUMA locality, pinning, buddy GPU chunks, LRU service
cache and API limits."""

from __future__ import annotations

import pytest
from action_factories import (
    api_action,
    basic_manager,
    cpu_action,
    cpu_manager,
    gpu_action,
    gpu_manager,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from loom.actions.managers.cpu import CpuManager, CpuNode
from loom.actions.managers.gpu import GpuManager, GpuNode, ServiceSpec
from loom.actions.tangram.arrange import free_blocks
from loom.core.errors import ConfigError


def test_cpu_core_sets_are_exclusive_and_numa_local() -> None:
    mgr = cpu_manager(cores=16, numa=2)
    g1 = mgr.allocate(cpu_action(1, hi=8), 6, "n0", 0.0)
    g2 = mgr.allocate(cpu_action(2, hi=8), 4, "n0", 0.0)
    numa = mgr.nodes["n0"].numa
    for g in (g1, g2):  # each fits one NUMA domain, so it stays in one
        assert any(set(g.cores) <= set(d) for d in numa)
    assert not set(g1.cores) & set(g2.cores)
    # 6 free cores are left, split 2 + 4 across domains: a 6-core action spans both.
    g3 = mgr.allocate(cpu_action(3, hi=8), 6, "n0", 0.0)
    assert not set(g3.cores) & (set(g1.cores) | set(g2.cores))
    assert mgr.free_cores("n0") == 0
    mgr.release(cpu_action(1), g1, 1.0)
    assert mgr.free_cores("n0") == 6


def test_trajectory_pins_to_the_node_with_most_free_memory() -> None:
    mgr = CpuManager([CpuNode.uniform("a", 8, 1, 100.0), CpuNode.uniform("b", 8, 1, 100.0)])
    first = cpu_action(1, traj="x", mem=30)
    node = mgr.ledger().take(first, 1)
    g = mgr.allocate(first, 1, node, 0.0)
    # The other node now has more free memory, so a new trajectory goes there ...
    other = cpu_action(2, traj="y", mem=10)
    assert mgr.ledger().take(other, 1) != g.domain
    # ... while the same trajectory's next action stays on its node.
    again = cpu_action(3, traj="x", mem=30)
    assert mgr.pinned_domain(again) == g.domain
    assert mgr.ledger().take(again, 1) == g.domain
    mgr.release(first, g, 1.0)
    mgr.end_trajectory("x")
    assert mgr.free_memory_gb(g.domain) == pytest.approx(100.0)
    assert mgr.pinned_domain(again) is None


def test_cpu_rejects_actions_bigger_than_any_node() -> None:
    with pytest.raises(ConfigError, match="more than any CPU node"):
        cpu_manager(cores=8).validate(cpu_action(1, lo=9, hi=9))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from([1, 2, 4, 8])), max_size=40))
def test_gpu_chunks_are_aligned_disjoint_and_merge_back(ops: list[tuple[bool, int]]) -> None:
    mgr = GpuManager([GpuNode(name="g")], [ServiceSpec(name="s", weights_gb=1.0)])
    held = []
    for i, (alloc, size) in enumerate(ops):
        if alloc or not held:
            act = gpu_action(i, "s", dops=(size,))
            if mgr.ledger().take(act, size, "g") is None:
                busy = {d for _, g in held for d in g.gpus}
                assert all(z < size for _, z in free_blocks(8, busy)), "refused a free chunk"
                continue
            grant = mgr.allocate(act, size, "g", float(i))
            assert grant.gpus[0] % size == 0 and len(grant.gpus) == size
            held.append((act, grant))
        else:
            act, grant = held.pop(0)
            mgr.release(act, grant, float(i))
        busy = [d for _, g in held for d in g.gpus]
        assert len(busy) == len(set(busy)), "a GPU was given twice"
        assert mgr.free_gpus("g") == 8 - len(busy)
    for act, grant in held:
        mgr.release(act, grant, 99.0)
    assert mgr.ledger().free_units("g") == 8
    assert mgr.ledger().take(gpu_action(999, "s", dops=(8,)), 8, "g") == "g"


def test_gpu_cache_hit_skips_restore_and_lru_evicts() -> None:
    mgr = gpu_manager(memory_gb=80.0)
    judge, teacher = gpu_action(1, "judge", dops=(4,)), gpu_action(2, "teacher", dops=(4,))
    g1 = mgr.allocate(judge, 4, "g0", 0.0)
    assert g1.overhead_s > 0 and mgr.restores == 1
    mgr.release(judge, g1, 1.0)
    g2 = mgr.allocate(gpu_action(3, "judge", dops=(4,)), 4, "g0", 2.0)
    assert g2.overhead_s == 0.0 and g2.gpus == g1.gpus, "prefers the chunk caching the service"
    mgr.release(gpu_action(3, "judge"), g2, 3.0)
    # teacher at TP4 needs 34 GB per GPU; judge holds 19 GB there; both fit 80 GB.
    g3 = mgr.allocate(teacher, 4, "g0", 4.0)
    assert ("judge", 4, 0) in mgr.cached("g0")
    mgr.release(teacher, g3, 5.0)
    # A TP2 teacher needs 64 GB per GPU: it must evict what overlaps its chunk, LRU first.
    t2 = gpu_action(4, "teacher", dops=(2,))
    g4 = mgr.allocate(t2, 2, "g0", 6.0)
    for gpu in g4.gpus:
        assert mgr.memory_used_gb("g0", gpu) <= 80.0
    assert ("teacher", 2, g4.gpus[0]) in mgr.cached("g0")


def test_gpu_rejects_unknown_service_and_impossible_degree() -> None:
    mgr = gpu_manager()
    with pytest.raises(ConfigError, match="unknown service"):
        mgr.validate(gpu_action(1, "nope"))
    with pytest.raises(ConfigError, match="no degree"):
        mgr.validate(gpu_action(2, "teacher", dops=(1,)))  # 120 GB on one 80 GB GPU


def test_basic_concurrency_and_quota_window() -> None:
    mgr = basic_manager(concurrency=2, quota=3)
    ledger = mgr.ledger()
    assert ledger.take(api_action(1), None) == "api:search"
    assert ledger.take(api_action(2), None) == "api:search"
    assert ledger.take(api_action(3), None) is None  # concurrency 2
    grants = [mgr.allocate(api_action(i), 1, "api:search", 0.0) for i in (1, 2)]
    mgr.release(api_action(1), grants[0], 1.0)
    g3 = mgr.allocate(api_action(3), 1, "api:search", 1.0)
    mgr.release(api_action(2), grants[1], 2.0)
    mgr.release(api_action(3), g3, 2.0)
    # Three starts used the window's quota: nothing more until the period rolls over.
    assert mgr.ledger().take(api_action(4), None) is None
    assert mgr.next_change_s(2.0) == pytest.approx(10.0)
    mgr.next_change_s(10.0)
    assert mgr.ledger().take(api_action(4), None) == "api:search"
