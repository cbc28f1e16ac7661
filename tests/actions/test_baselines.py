"""The baselines of §6.1 and §6.3 as policies: Kubernetes pods, independent API calls, static
SGLang deployments, ServerlessLLM, and routing one policy per action kind."""

from __future__ import annotations

import pytest
from action_factories import api_action, cpu_action, gpu_action

from loom.actions.baselines import (
    Deployment,
    IndependentApi,
    KubeConfig,
    Kubernetes,
    PodPhase,
    Routed,
    Serverless,
    ServerlessConfig,
    StaticServing,
    place_replicas,
)
from loom.actions.managers.cpu import CpuNode
from loom.actions.managers.gpu import GpuNode, ServiceSpec
from loom.actions.policy import ACTION_POLICIES, ActionPolicyKind
from loom.core.actions import ActionKind
from loom.core.errors import ConfigError

NODE = CpuNode.uniform("n0", 2, 1, 16.0)
SERVICES = {
    "judge": ServiceSpec(name="judge", weights_gb=60.0),
    "teacher": ServiceSpec(name="teacher", weights_gb=120.0, dops=(2, 4, 8)),
}


def kube(**kw: float) -> Kubernetes:
    base: dict = dict(
        pod_memory_gb=4.0, startup_s=2.0, exec_overhead_s=0.1, bind_qps=10.0, node_start_qps=1e3
    )
    return Kubernetes([NODE], KubeConfig(**{**base, **kw}))


# ---- Kubernetes ------------------------------------------------------------------------------
def _start(k, n: int) -> tuple[list, float]:
    """Advance from time 0 through the policy's wake-ups until `n` actions have started."""
    started, now = k.schedule(0.0), 0.0
    while len(started) < n:
        now = k.next_wakeup(now)
        started += k.schedule(now)
    return started, now


def test_k8s_queues_pods_when_the_node_is_full() -> None:
    """Four pods of 4 GB fill a 16 GB node; the fifth stays pending until a pod terminates."""
    k = kube(termination_s=30.0)
    for i in range(5):
        k.begin_trajectory(f"t{i}", 0.0)
        k.submit(cpu_action(i), 0.0)
    started, now = _start(k, 4)
    assert now == pytest.approx(0.3)  # one bind per 0.1 s
    assert k.schedule(now) == [] and k.pending_pods == 1 and k.queued == 1
    assert [s.overhead_s for s in started] == pytest.approx([2.1] * 4)
    assert k.pod_phase("t4") == PodPhase.PENDING
    for s in started[:1]:
        k.finish(s.action.action_id, 5.0)
        k.end_trajectory(s.action.trajectory_id, 5.0)
    assert k.schedule(10.0) == [] and k.next_wakeup(10.0) == 35.0  # still terminating
    (late,) = k.schedule(35.0)
    assert late.action.trajectory_id == "t4" and late.overhead_s == pytest.approx(2.1)
    assert k.requested_cpu("n0") <= NODE.num_cores


def test_k8s_binds_at_the_control_plane_rate() -> None:
    k = kube(bind_qps=2.0)
    for i in range(3):
        k.submit(cpu_action(i), 0.0)  # no begin_trajectory: the pod is made on demand
    assert len(k.schedule(0.0)) == 1 and k.next_wakeup(0.0) == 0.5
    assert len(k.schedule(0.5)) == 1 and len(k.schedule(0.7)) == 0
    assert len(k.schedule(1.0)) == 1


def test_k8s_node_starts_a_burst_of_pods_at_its_rate() -> None:
    """Binding is faster than the node brings pods up: pods queue at the node, one every
    1/node_start_qps seconds after the first one's start-up; a pod bound later to an idle
    node pays the plain start-up time again."""
    k = kube(bind_qps=100.0, node_start_qps=2.0)
    for i in range(4):
        k.begin_trajectory(f"t{i}", 0.0)
        k.submit(cpu_action(i), 0.0)
    started, _ = _start(k, 4)
    ready = [
        s.overhead_s - 0.1 + now_ for s, now_ in zip(started, (0.0, 0.01, 0.02, 0.03), strict=True)
    ]
    assert ready == pytest.approx([2.0, 2.5, 3.0, 3.5])
    for s in started:
        k.finish(s.action.action_id, 10.0)
        k.end_trajectory(s.action.trajectory_id, 10.0)
    k.submit(cpu_action(9), 50.0)
    (late,) = k.schedule(50.0)
    assert late.overhead_s == pytest.approx(2.1)
    with pytest.raises(ConfigError, match="node_start_qps"):
        KubeConfig(node_start_qps=0.0)


def test_k8s_recreates_pods_pending_past_the_timeout() -> None:
    """One pod fits; the two pending ones are re-created at the back after the timeout."""
    k = Kubernetes([CpuNode.uniform("n0", 2, 1, 4.0)], KubeConfig(pod_memory_gb=4.0))
    for i in range(3):
        k.submit(cpu_action(i), 0.0)
    (first,) = k.schedule(0.0)
    assert k.next_wakeup(0.0) == 300.0  # full: only the pending timeout can change anything
    assert k.schedule(300.0) == [] and k.timeouts == 2 and k.pending_pods == 2
    k.finish(first.action.action_id, 310.0)
    k.end_trajectory(first.action.trajectory_id, 310.0)
    assert k.next_wakeup(310.0) == 340.0  # terminated after the grace period
    (second,) = k.schedule(340.0)
    assert second.action.trajectory_id == "t1" and k.pods_created == 5


def test_k8s_caps_threads_at_the_pod_limit_and_rejects_other_kinds() -> None:
    k = kube()
    k.submit(cpu_action(0, lo=1, hi=32), 0.0)
    (s,) = k.schedule(0.0)
    assert s.units == 4 and s.cores == () and s.expected_s == s.action.duration_s(4)
    with pytest.raises(ConfigError, match="CPU actions only"):
        k.submit(api_action(1), 0.0)
    with pytest.raises(ConfigError, match="not running"):
        k.finish("nope", 1.0)


# ---- independent API -------------------------------------------------------------------------
def test_independent_api_starts_everything_at_once() -> None:
    p = IndependentApi()
    for i in range(5):
        p.submit(api_action(i), 0.0)
    starts = p.schedule(0.0)
    assert len(starts) == 5 and p.queued == 0 and p.running == 5
    assert all(s.domain == "api:search" and s.overhead_s == 0 for s in starts)
    with pytest.raises(ConfigError, match="API actions only"):
        p.submit(cpu_action(9), 0.0)
    assert p.next_wakeup(0.0) is None


# ---- SGLang, static ----------------------------------------------------------------------------
def nodes(n: int = 1) -> list[GpuNode]:
    return [GpuNode(name=f"g{k}") for k in range(n)]


def test_sglang_static_never_restores_and_keeps_each_service_on_its_gpus() -> None:
    deps = [Deployment(service="judge", replicas=1, tp=4), Deployment(service="teacher", tp=4)]
    p = StaticServing(nodes(), SERVICES, deps)
    for i in range(6):
        p.submit(gpu_action(i, "judge" if i % 2 else "teacher"), float(i))
    first = p.schedule(6.0)
    assert len(first) == 2 and p.queued == 4
    gpus = {s.action.service: s.gpus for s in first}
    while p.queued or p.running:
        for s in first:
            p.finish(s.action.action_id, 7.0)
        first = p.schedule(7.0)
        for s in first:
            assert s.overhead_s == 0.0 and s.units == 4
            assert s.gpus == gpus[s.action.service]


def test_sglang_static_placement() -> None:
    spots = place_replicas(nodes(2), SERVICES, [Deployment(service="judge", replicas=3, tp=4)])
    assert [(n, off) for _, n, off, _ in spots] == [("g0", 0), ("g0", 4), ("g1", 0)]
    with pytest.raises(ConfigError, match="no room"):
        place_replicas(nodes(1), SERVICES, [Deployment(service="judge", replicas=3, tp=4)])
    with pytest.raises(ConfigError, match="unknown service"):
        place_replicas(nodes(1), SERVICES, [Deployment(service="x")])
    p = StaticServing(nodes(), SERVICES, [Deployment(service="judge")])
    with pytest.raises(ConfigError, match="not deployed"):
        p.submit(gpu_action(0, "teacher"), 0.0)


# ---- ServerlessLLM -----------------------------------------------------------------------------
def test_serverless_loads_on_demand_and_unloads_idle_instances() -> None:
    cfg = ServerlessConfig(degree=4, startup_s=5.0, loader_gbs=20.0, keep_alive_s=0.0)
    p = Serverless(nodes(), SERVICES, cfg)
    p.submit(gpu_action(0, "judge"), 0.0)
    (s,) = p.schedule(0.0)
    assert s.overhead_s == pytest.approx(5.0 + 60.0 / 4 / 20.0) and s.units == 4
    p.submit(gpu_action(1, "judge"), 1.0)
    (again,) = p.schedule(1.0)  # scale-out: a second instance on the free slot
    assert again.gpus != s.gpus and again.overhead_s > 0
    p.finish(s.action.action_id, 2.0)
    p.submit(gpu_action(2, "judge"), 2.0)
    (warm,) = p.schedule(2.0)
    assert warm.overhead_s == 0.0 and warm.gpus == s.gpus
    p.finish(warm.action.action_id, 3.0)
    p.finish(again.action.action_id, 3.0)
    p.submit(gpu_action(3, "judge"), 4.0)
    (cold,) = p.schedule(4.0)  # keep-alive 0: both instances went idle and were unloaded
    assert cold.overhead_s > 0
    assert p.loads == 3


def test_serverless_waits_for_a_slot_first_come_first_served() -> None:
    p = Serverless(nodes(), SERVICES, ServerlessConfig(keep_alive_s=60.0))
    for i, svc in enumerate(["judge", "judge", "teacher"]):
        p.submit(gpu_action(i, svc), 0.0)
    starts = p.schedule(0.0)
    assert [s.action.service for s in starts] == ["judge", "judge"] and p.queued == 1
    for s in starts:
        p.finish(s.action.action_id, 1.0)
    assert p.schedule(1.0) == [] and p.next_wakeup(1.0) == 61.0  # kept alive until then
    (t,) = p.schedule(61.0)
    assert t.action.service == "teacher"


# ---- routing and registration ------------------------------------------------------------------
def test_routed_sends_each_kind_to_its_policy() -> None:
    api, gpu = IndependentApi(), StaticServing(nodes(), SERVICES, [Deployment(service="judge")])
    r = Routed({ActionKind.API: api, ActionKind.GPU_SERVICE: gpu})
    r.submit(api_action(0), 0.0)
    r.submit(gpu_action(1, "judge"), 0.0)
    assert r.queued == 2 and len(r.schedule(0.0)) == 2 and r.running == 2
    r.finish("a0", 1.0)
    assert api.running == 0 and gpu.running == 1
    with pytest.raises(ConfigError, match="no policy for"):
        r.submit(cpu_action(2), 0.0)


def test_every_baseline_is_registered() -> None:
    for kind in ActionPolicyKind:
        assert kind in ACTION_POLICIES or kind.value in {"tangram", "dop4", "dop16"}
    for kind in ("k8s", "sglang_static", "independent_api", "serverlessllm"):
        assert kind in ACTION_POLICIES
