"""The action-level simulator: capacity is never exceeded and every action ends, under every
registered policy; a seed fixes the run; the physics (processor sharing, provider limits)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest

import loom.actions.tangram.scheduler  # noqa: F401  (registers tangram, dop4, dop16)
from loom.actions.baselines import Deployment, KubeConfig, Kubernetes, Routed
from loom.actions.policy import ACTION_POLICIES, ActionPolicy, ActionPolicyKind, Start
from loom.core.actions import ActionKind, ActionSpec, ActionStatus
from loom.core.errors import ConfigError
from loom.core.resources import RangeSet
from loom.sim.actions import (
    ActionRecord,
    ActionSimulator,
    ActionStep,
    ApiProvider,
    SimConfig,
    SimResult,
    Stage,
    Testbed,
    TrajectoryPlan,
)
from loom.sim.workloads.actions import (
    CodingParams,
    DeepSearchParams,
    MopdParams,
    coding_batch,
    cpu_testbed,
    deepsearch_batch,
    gpu_testbed,
    judge_service,
    mopd_batch,
    search_apis,
    teacher_services,
)

P = ActionPolicyKind
CODING = CodingParams(env_actions_median=4, llm_median_s=2.0, reward_median_s=20.0)
MOPD = MopdParams(teachers=3, llm_median_min_s=2.0, llm_median_max_s=10.0)
SEARCH = DeepSearchParams(calls_median=3, llm_median_s=0.5)


# ---- worlds: a testbed, seeded batches and the policy to run on them -------------------------
def coding_world(seed: int) -> tuple[Testbed, list[list[TrajectoryPlan]]]:
    bed = cpu_testbed(2, node_cores=16)
    return bed, [coding_batch(24, seed, k, CODING) for k in range(2)]


def mopd_world(seed: int) -> tuple[Testbed, list[list[TrajectoryPlan]]]:
    bed = gpu_testbed(12, teacher_services(MOPD))
    return bed, [mopd_batch(30, seed, 0, MOPD)]


def search_world(seed: int) -> tuple[Testbed, list[list[TrajectoryPlan]]]:
    bed = gpu_testbed(16, (*teacher_services(MOPD), judge_service()), search_apis(0.01))
    batch = mopd_batch(10, seed, 0, MOPD) + deepsearch_batch(30, seed, 0, SEARCH)
    return bed, [batch]


def tangram_like(kind: P) -> Callable[[Testbed], ActionPolicy]:
    return lambda bed: ACTION_POLICIES.get(kind)(bed.managers())


def k8s(bed: Testbed) -> ActionPolicy:
    return ACTION_POLICIES.get(P.K8S)(bed.managers(), config=KubeConfig(pod_memory_gb=8.0))


def gpu_baseline(kind: P) -> Callable[[Testbed], ActionPolicy]:
    def make(bed: Testbed) -> ActionPolicy:
        ms = bed.managers()
        routes = {ActionKind.GPU_SERVICE: ACTION_POLICIES.get(kind)(ms)}
        if bed.apis:
            routes[ActionKind.API] = ACTION_POLICIES.get(P.INDEPENDENT_API)(ms)
        return Routed(routes)

    return make


def independent(bed: Testbed) -> ActionPolicy:
    ms = bed.managers()
    judge = ACTION_POLICIES.get(P.SGLANG_STATIC)(
        ms, deployments=[Deployment(service=s.name, replicas=1, tp=4) for s in bed.services]
    )
    api = ACTION_POLICIES.get(P.INDEPENDENT_API)(ms)
    return Routed({ActionKind.API: api, ActionKind.GPU_SERVICE: judge})


World = Callable[[int], tuple[Testbed, list[list[TrajectoryPlan]]]]
CASES: list[tuple[str, World, Callable[[Testbed], ActionPolicy]]] = [
    ("tangram-coding", coding_world, tangram_like(P.TANGRAM)),
    ("lookahead-coding", coding_world, tangram_like(P.TANGRAM_LOOKAHEAD)),
    ("dop4-coding", coding_world, tangram_like(P.DOP4)),
    ("dop16-coding", coding_world, tangram_like(P.DOP16)),
    ("k8s-coding", coding_world, k8s),
    ("tangram-mopd", mopd_world, tangram_like(P.TANGRAM)),
    ("sglang-mopd", mopd_world, gpu_baseline(P.SGLANG_STATIC)),
    ("serverless-mopd", mopd_world, gpu_baseline(P.SERVERLESSLLM)),
    ("tangram-search", search_world, tangram_like(P.TANGRAM)),
    ("lookahead-mopd", mopd_world, tangram_like(P.TANGRAM_LOOKAHEAD)),
    ("independent-search", search_world, independent),
    ("serverless-search", search_world, gpu_baseline(P.SERVERLESSLLM)),
]


class Audited:
    """Forwards to a policy and checks, after every decision, that no started action shares a
    core or GPU and that Kubernetes never requests more than a node has."""

    def __init__(self, inner: ActionPolicy, bed: Testbed) -> None:
        self.inner = inner
        self.bed = bed
        self.starts: dict[str, Start] = {}

    @property
    def queued(self) -> int:
        return self.inner.queued

    @property
    def running(self) -> int:
        return self.inner.running

    def begin_trajectory(self, trajectory_id: str, now: float) -> None:
        begin = getattr(self.inner, "begin_trajectory", None)
        if begin is not None:
            begin(trajectory_id, now)

    def submit(self, action: ActionSpec, now: float) -> None:
        self.inner.submit(action, now)

    def schedule(self, now: float) -> Sequence[Start]:
        starts = self.inner.schedule(now)
        for s in starts:
            self.starts[s.action.action_id] = s
        devices = [(s.domain, c) for s in self.starts.values() for c in s.cores]
        devices += [(s.domain, "gpu", g) for s in self.starts.values() for g in s.gpus]
        assert len(devices) == len(set(devices)), "a device is held twice"
        k8s = self.inner if isinstance(self.inner, Kubernetes) else None
        for node in self.bed.cpu_nodes:
            if k8s is not None:
                assert k8s.requested_cpu(node.name) <= node.num_cores
        return starts

    def finish(self, action_id: str, now: float) -> None:
        del self.starts[action_id]
        self.inner.finish(action_id, now)

    def cancel(self, action_id: str) -> bool:
        return self.inner.cancel(action_id)

    def end_trajectory(self, trajectory_id: str, now: float) -> None:
        self.inner.end_trajectory(trajectory_id, now)

    def next_wakeup(self, now: float) -> float | None:
        return self.inner.next_wakeup(now)


def simulate(world: World, make: Callable[[Testbed], ActionPolicy], seed: int) -> SimResult:
    bed, batches = world(seed)
    return ActionSimulator(Audited(make(bed), bed), bed, batches).run()


def peak(records: Sequence[ActionRecord], keep: Callable[[ActionRecord], bool]) -> int:
    """Most units held at once by the selected records (ends before starts at equal times)."""
    events = sorted(
        [(r.start_s, 1, r.units) for r in records if keep(r)]
        + [(r.end_s, 0, -r.units) for r in records if keep(r)]
    )
    held = top = 0
    for _, _, du in events:
        held += du
        top = max(top, held)
    return top


@pytest.mark.parametrize(("name", "world", "make"), CASES, ids=[c[0] for c in CASES])
def test_every_policy_stays_within_capacity_and_ends_every_action(
    name: str, world: World, make: Callable[[Testbed], ActionPolicy]
) -> None:
    bed, batches = world(7)
    res = simulate(world, make, 7)
    plans = {p.trajectory_id: p for b in batches for p in b}
    # every trajectory ran its plan (a re-run, "<id>~k", its prompt's), plus re-issued calls
    planned = sum(len(plans[t.trajectory_id.split("~")[0]].steps) for t in res.trajectories)
    assert len(res.actions) == planned + res.counters["reissued"]
    assert all(a.status.terminal for a in res.actions)
    assert all(a.submit_s <= a.start_s <= a.end_s for a in res.actions)
    assert len(res.trajectories) == len(plans) + res.counters["reruns"]
    assert res.counters["reruns"] <= res.counters["ineffective"]
    assert sum(not t.effective for t in res.trajectories) == res.counters["ineffective"]
    assert len(res.steps) == len(batches)
    exclusive_cpu = not name.startswith("k8s")
    for node in bed.cpu_nodes:
        if exclusive_cpu:
            on = node.name
            assert peak(res.actions, lambda r, on=on: r.domain == on) <= node.num_cores
    for node in bed.gpu_nodes:
        on = node.name
        assert peak(res.actions, lambda r, on=on: r.domain == on) <= node.gpus
    for api in bed.apis:
        assert res.counters["api_rejections"] >= 0
        if name.startswith("tangram"):  # traffic control: never over the provider's limit
            key = api.key
            assert peak(res.actions, lambda r, key=key: r.domain == key) <= api.concurrency
            assert res.counters["api_rejections"] == 0


@pytest.mark.parametrize(("name", "world", "make"), CASES, ids=[c[0] for c in CASES])
def test_same_seed_same_records_different_seed_different(
    name: str, world: World, make: Callable[[Testbed], ActionPolicy]
) -> None:
    a, b = simulate(world, make, 3), simulate(world, make, 3)
    assert a.actions == b.actions and a.trajectories == b.trajectories
    c = simulate(world, make, 4)
    assert [r.end_s for r in c.actions] != [r.end_s for r in a.actions]


# ---- physics ---------------------------------------------------------------------------------
def one_cpu_action(i: int, threads: int, t: float, llm: float = 0.0) -> TrajectoryPlan:
    tid = f"t{i}"
    spec = ActionSpec(
        action_id=f"{tid}/0",
        trajectory_id=tid,
        kind=ActionKind.CPU_TOOL,
        demand={"cpu": RangeSet(threads, threads)},
        key_resource="cpu",
        t_ori_s=t,
    )
    return TrajectoryPlan(
        trajectory_id=tid, workload="w", steps=(ActionStep(llm_s=llm, spec=spec, stage=Stage.TOOL),)
    )


def test_overcommitted_node_shares_its_cores() -> None:
    """Kubernetes pods overlap on one 2-core node: four one-thread actions of 10 s each take
    20 s by processor sharing, where exclusive cores would queue two of them."""
    bed = cpu_testbed(1, node_cores=2, memory_gb=64.0, action_overhead_s=0.0)
    plans = [one_cpu_action(i, 1, 10.0) for i in range(4)]
    config = KubeConfig(
        pod_memory_gb=1.0, startup_s=0.0, exec_overhead_s=0.0, bind_qps=1e9, node_start_qps=1e9
    )
    res = ActionSimulator(Kubernetes(bed.cpu_nodes, config), bed, [plans]).run()
    assert [round(a.end_s, 6) for a in res.actions] == [20.0] * 4
    res = ActionSimulator(ACTION_POLICIES.get(P.TANGRAM)(bed.managers()), bed, [plans]).run()
    assert sorted(round(a.end_s, 6) for a in res.actions) == [10.0, 10.0, 20.0, 20.0]


def test_true_duration_scales_the_profile_by_noise() -> None:
    bed = cpu_testbed(1, node_cores=4, memory_gb=64.0, action_overhead_s=0.0)
    plan = one_cpu_action(0, 1, 10.0, llm=5.0)
    step = dataclasses.replace(plan.steps[0], noise=1.5)
    plan = dataclasses.replace(plan, steps=(step,))
    res = ActionSimulator(ACTION_POLICIES.get(P.TANGRAM)(bed.managers()), bed, [[plan]]).run()
    (a,) = res.actions
    assert (a.submit_s, a.start_s, a.end_s) == (5.0, 5.0, 20.0)
    assert a.act_s == 15.0 and a.exec_s == 15.0 and a.queue_s == 0.0


def test_cpu_manager_charges_its_overhead_before_each_action() -> None:
    """AOE's per-action cost (Table 1's 0.024 s by default) delays the run, not the start."""
    assert cpu_testbed(1).cpu_action_overhead_s == pytest.approx(0.024)
    bed = cpu_testbed(1, node_cores=4, memory_gb=64.0, action_overhead_s=0.5)
    plan = one_cpu_action(0, 1, 10.0, llm=5.0)
    res = ActionSimulator(ACTION_POLICIES.get(P.TANGRAM)(bed.managers()), bed, [[plan]]).run()
    (a,) = res.actions
    assert (a.start_s, a.end_s, a.overhead_s) == (5.0, 15.5, 0.5)
    assert a.exec_s == pytest.approx(10.0) and a.queue_s == 0.0


def api_plan(i: int, latency: float) -> TrajectoryPlan:
    tid = f"t{i}"
    spec = ActionSpec(
        action_id=f"{tid}/0",
        trajectory_id=tid,
        kind=ActionKind.API,
        demand={"api:x": RangeSet(1, 1)},
        t_ori_s=latency,
    )
    return TrajectoryPlan(
        trajectory_id=tid, workload="w", steps=(ActionStep(llm_s=0.0, spec=spec, stage=Stage.TOOL),)
    )


def test_rejected_calls_retry_three_times_then_fail() -> None:
    bed = Testbed(apis=(ApiProvider(name="x", concurrency=1, error_latency_s=0.5),))
    plans = [api_plan(i, 100.0) for i in range(2)]
    policy = ACTION_POLICIES.get(P.INDEPENDENT_API)()
    res = ActionSimulator(policy, bed, [plans], SimConfig(reissues=0, reruns=0)).run()
    ok, failed = sorted(res.actions, key=lambda a: a.status)
    assert ok.status == ActionStatus.SUCCEEDED and ok.end_s == 100.0
    assert failed.status == ActionStatus.FAILED and failed.attempts == 4
    # four rejections of 0.5 s each, with back-off of 1, 2 and 4 s between them
    assert failed.end_s == pytest.approx(4 * 0.5 + 1 + 2 + 4)
    assert res.counters["api_retries"] == 3 and res.counters["api_rejections"] == 4


def test_calls_past_the_timeout_are_cut_and_retried() -> None:
    bed = Testbed(apis=(ApiProvider(name="x", concurrency=4),))
    policy = ACTION_POLICIES.get(P.INDEPENDENT_API)()
    config = SimConfig(reissues=0, reruns=0)
    res = ActionSimulator(policy, bed, [[api_plan(0, 700.0)]], config).run()
    (a,) = res.actions
    assert a.status == ActionStatus.TIMED_OUT and a.attempts == 4
    assert a.end_s == pytest.approx(4 * 600 + 1 + 2 + 4)


def test_a_failed_tool_call_is_issued_again_after_another_turn() -> None:
    bed = Testbed(apis=(ApiProvider(name="x", concurrency=1, error_latency_s=0.0),))
    plans = [api_plan(i, 100.0) for i in range(2)]
    res = ActionSimulator(
        ACTION_POLICIES.get(P.INDEPENDENT_API)(), bed, [plans], SimConfig(reissues=1, reruns=0)
    ).run()
    assert res.counters["reissued"] == 1
    assert {a.action_id for a in res.actions} == {"t0/0", "t1/0", "t1/0.r"}


def test_a_trajectory_with_a_failed_call_is_ineffective_and_its_prompt_runs_again() -> None:
    # §6.2: API failures make baseline trajectories ineffective and the step slow
    bed = Testbed(apis=(ApiProvider(name="x", concurrency=1, error_latency_s=0.5),))
    plans = [api_plan(i, 12.0) for i in range(2)]
    config = SimConfig(reissues=0, reruns=2)
    res = ActionSimulator(ACTION_POLICIES.get(P.INDEPENDENT_API)(), bed, [plans], config).run()
    by_id = {t.trajectory_id: t for t in res.trajectories}
    # t0 holds the only slot for 12 s; t1 is rejected four times and fails at 9 s; its re-run
    # t1~1 starts then, is rejected at 9 and 10.5 s, admitted at 13 s and ends at 25 s
    assert set(by_id) == {"t0", "t1", "t1~1"}
    assert [by_id[t].effective for t in ("t0", "t1", "t1~1")] == [True, False, True]
    assert by_id["t1~1"].run == 1 and by_id["t1~1"].start_s == pytest.approx(9.0)
    (step,) = res.steps
    assert step.end_s == pytest.approx(25.0)  # not 12 s: the re-run holds the step
    assert res.counters["ineffective"] == 1 and res.counters["reruns"] == 1


def test_reruns_are_bounded_so_the_step_ends() -> None:
    bed = Testbed(apis=(ApiProvider(name="x", concurrency=4),))
    config = SimConfig(reissues=0, reruns=2)
    policy = ACTION_POLICIES.get(P.INDEPENDENT_API)()
    res = ActionSimulator(policy, bed, [[api_plan(0, 700.0)]], config).run()
    assert [t.run for t in res.trajectories] == [0, 1, 2]
    assert not any(t.effective for t in res.trajectories)
    assert res.counters["reruns"] == 2 and res.counters["ineffective"] == 3
    assert res.steps[0].end_s == pytest.approx(3 * (4 * 600 + 1 + 2 + 4))


def test_tangram_queues_calls_within_the_limits_instead() -> None:
    bed = Testbed(apis=(ApiProvider(name="x", concurrency=1, quota=2, period_s=50.0),))
    plans = [api_plan(i, 10.0) for i in range(3)]
    res = ActionSimulator(ACTION_POLICIES.get(P.TANGRAM)(bed.managers()), bed, [plans]).run()
    assert sorted(a.start_s for a in res.actions) == [0.0, 10.0, 50.0]  # quota, then window
    assert res.counters["api_rejections"] == 0
    assert res.counters["reruns"] == 0 and all(t.effective for t in res.trajectories)


def test_bad_inputs_raise() -> None:
    bed = cpu_testbed(1, node_cores=4)
    policy = ACTION_POLICIES.get(P.TANGRAM)(bed.managers())
    with pytest.raises(ConfigError, match="non-empty batch"):
        ActionSimulator(policy, bed, [])
    plan = one_cpu_action(0, 1, 1.0)
    with pytest.raises(ConfigError, match="repeat"):
        ActionSimulator(policy, bed, [[plan], [plan]])
    with pytest.raises(ConfigError, match="noise"):
        ActionStep(llm_s=0.0, spec=plan.steps[0].spec, stage=Stage.TOOL, noise=0.0)
