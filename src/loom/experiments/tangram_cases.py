"""The runs behind ARL-Tangram's evaluation: one workload, one policy, one testbed size.

A `Case` names a run; `run_case` builds the testbed, the seeded batches and the policy under
test, and simulates. The baselines are the workload-specific ones of §6.1 (and §6.3's
ServerlessLLM), assembled from registered policies:

* coding: `k8s` (a pod per trajectory);
* deepsearch: `independent_api` (every trajectory calls the APIs itself), with the judge on
  SGLang, five replicas of TP8;
* mopd, mopd_search: `sglang_static` (every reward service on four GPUs with TP4); in
  mopd_search the search calls are made independently as in DeepSearch;
* the GPU scalability runs of §6.3 (`api=tangram`) vary only the GPU policy: API calls go
  through Tangram's traffic control under every policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import loom.actions.tangram.scheduler  # noqa: F401  (registers tangram, dop4 and dop16)
from loom.actions.baselines import Deployment, KubeConfig, Routed
from loom.actions.managers.basic import BasicManager
from loom.actions.policy import ACTION_POLICIES, ActionPolicy, ActionPolicyKind
from loom.core.actions import ActionKind
from loom.core.errors import ConfigError
from loom.sim.actions import ActionSimulator, SimResult, Testbed, TrajectoryPlan
from loom.sim.workloads.actions import (
    CPU_NODE_CORES,
    ActionWorkloadKind,
    CodingParams,
    coding_batch,
    cpu_testbed,
    deepsearch_batch,
    gpu_testbed,
    judge_service,
    mopd_batch,
    mopd_search_batch,
    reward_trace_batch,
    search_apis,
    teacher_services,
)

__all__ = ["REWARD_TRACE", "Case", "run_case"]

REWARD_TRACE = "coding_reward"  # §6.4's benchmark: the reward actions of AI coding alone
API_FULL_BATCH = 2048  # §6.1: API limits are sized for DeepSearch's batch of 2048
CODING = CodingParams()
# Policies that schedule every kind of action themselves (Tangram's scheduler, its variants).
ELASTIC = frozenset(
    {
        ActionPolicyKind.TANGRAM,
        ActionPolicyKind.TANGRAM_LOOKAHEAD,
        ActionPolicyKind.DOP4,
        ActionPolicyKind.DOP16,
    }
)


@dataclass(frozen=True, kw_only=True)
class Case:
    """One simulation: `workload` × `policy` on `cpu_nodes` nodes of 256 cores or `gpus` GPUs.

    `api` says who handles API calls when the policy under test is a GPU one: the workload's
    own baseline ("baseline") or Tangram's basic manager ("tangram", §6.3's GPU runs)."""

    workload: str
    policy: ActionPolicyKind
    batch_size: int
    seed: int
    cpu_nodes: int = 5
    gpus: int = 40
    rl_steps: int = 1
    api: str = field(default="baseline")
    coding: CodingParams = field(default=CODING)  # the AI-coding workload's parameters

    @property
    def cpu_cores(self) -> int:
        return self.cpu_nodes * CPU_NODE_CORES

    @property
    def api_scale(self) -> float:
        """API limits scale with the search batch, so smaller runs see the same pressure."""
        return self.batch_size / API_FULL_BATCH

    def components(self) -> str:
        """Which registered policy handled which kind of action."""
        return ",".join(f"{k}={v}" for k, v in _components(self).items())


def _components(case: Case) -> dict[str, str]:
    p = case.policy.value
    wl = case.workload
    tangram = ActionPolicyKind.TANGRAM.value
    if case.policy in ELASTIC:
        return {"all": p}
    if wl == ActionWorkloadKind.DEEPSEARCH:
        return {"api": p, "gpu": ActionPolicyKind.SGLANG_STATIC.value}
    if wl == ActionWorkloadKind.MOPD_SEARCH:
        api = ActionPolicyKind.INDEPENDENT_API.value if case.api == "baseline" else tangram
        return {"api": api, "gpu": p}
    return {"cpu" if wl in (ActionWorkloadKind.CODING, REWARD_TRACE) else "gpu": p}


def testbed(case: Case) -> Testbed:
    wl = case.workload
    if wl in (ActionWorkloadKind.CODING, REWARD_TRACE):
        return cpu_testbed(case.cpu_nodes)
    if wl == ActionWorkloadKind.DEEPSEARCH:
        return gpu_testbed(case.gpus, (judge_service(),), search_apis(case.api_scale))
    if wl == ActionWorkloadKind.MOPD:
        return gpu_testbed(case.gpus, teacher_services())
    if wl == ActionWorkloadKind.MOPD_SEARCH:
        half = case.batch_size // 2
        apis = search_apis(half / API_FULL_BATCH)
        return gpu_testbed(case.gpus, (*teacher_services(), judge_service()), apis)
    raise ConfigError(f"unknown action workload {wl!r}")


Batch = Callable[[int, int, int, CodingParams], list[TrajectoryPlan]]
BATCHES: dict[str, Batch] = {
    ActionWorkloadKind.CODING.value: lambda b, s, k, c: coding_batch(b, s, k, c),
    REWARD_TRACE: lambda b, s, k, c: reward_trace_batch(b, s, k, c),
    ActionWorkloadKind.DEEPSEARCH.value: lambda b, s, k, c: deepsearch_batch(b, s, k),
    ActionWorkloadKind.MOPD.value: lambda b, s, k, c: mopd_batch(b, s, k),
    ActionWorkloadKind.MOPD_SEARCH.value: lambda b, s, k, c: mopd_search_batch(b, s, k),
}


def build_policy(case: Case, bed: Testbed) -> ActionPolicy:
    kind = case.policy
    managers = bed.managers()
    make = ACTION_POLICIES.get(kind)
    if kind in ELASTIC:
        return make(managers)
    if kind == ActionPolicyKind.K8S:
        return make(managers, config=KubeConfig(pod_memory_gb=float(case.coding.memory_gb)))
    if kind == ActionPolicyKind.INDEPENDENT_API:
        judge = ACTION_POLICIES.get(ActionPolicyKind.SGLANG_STATIC)(
            managers,
            deployments=[Deployment(service="judge", replicas=5, tp=8)],  # §6.1
        )
        return Routed({ActionKind.API: make(managers), ActionKind.GPU_SERVICE: judge})
    gpu = make(managers)
    if case.workload != ActionWorkloadKind.MOPD_SEARCH:
        return gpu
    if case.api == "baseline":
        api = ACTION_POLICIES.get(ActionPolicyKind.INDEPENDENT_API)(managers)
    else:  # Tangram's traffic control alone: a scheduler over the basic manager
        basic = [m for m in managers if isinstance(m, BasicManager)]
        api = ACTION_POLICIES.get(ActionPolicyKind.TANGRAM)(basic)
    return Routed({ActionKind.API: api, ActionKind.GPU_SERVICE: gpu})


def run_case(case: Case) -> SimResult:
    bed = testbed(case)
    make_batch = BATCHES[case.workload]
    batches = [make_batch(case.batch_size, case.seed, k, case.coding) for k in range(case.rl_steps)]
    return ActionSimulator(build_policy(case, bed), bed, batches).run()
