"""The AI-coding baseline of §6.1: Kubernetes with a pod per trajectory for its whole life.

Each trajectory asks for a pod when it begins (0.5 CPU requested, a 4-CPU limit, its
environment's memory). The control plane binds pending pods first come, first served at its
client rate to the least-allocated node that fits the requests; a bound pod is ready after its
start-up time, and each node's kubelet and container runtime bring pods up at a bounded rate, so
a burst of pods bound to one node queues there. A pod pending past the framework's timeout is
deleted and created again at the back of the queue. Actions run inside the trajectory's pod
through `exec`, unpinned: the node's cores are shared among running actions by the kernel (the
simulator's processor sharing), each action using at most the pod's CPU limit. A finished
trajectory's pod frees its requests only once terminated.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from loom.actions.baselines.common import manager_of
from loom.actions.managers.base import Grant, ResourceManager
from loom.actions.managers.cpu import CpuManager, CpuNode
from loom.actions.policy import ACTION_POLICIES, ActionPolicyKind, Start
from loom.core.actions import ActionKind, ActionSpec
from loom.core.errors import ConfigError
from loom.core.resources import ResourceKind

__all__ = ["KubeConfig", "Kubernetes", "PodPhase"]

CPU = ResourceKind.CPU.value


@dataclass(frozen=True, kw_only=True)
class KubeConfig:
    cpu_request: float = field(default=0.5, metadata={"help": "CPU requested per pod (§6.1)"})
    cpu_limit: int = field(default=4, metadata={"help": "CPU limit per pod (§6.1)"})
    pod_memory_gb: float = field(
        default=8.0, metadata={"help": "memory requested per pod: the environment's memory"}
    )
    bind_qps: float = field(
        default=50.0, metadata={"help": "pods bound per second: kube-scheduler's default QPS"}
    )
    startup_s: float = field(
        default=2.0,
        metadata={
            "help": "assumed: bound to running with a cached image (the SIG-scalability "
            "SLO is 5 s at p99)"
        },
    )
    node_start_qps: float = field(
        default=5.0,
        metadata={
            "help": "pods one node brings up per second in a burst: kubernetes-sigs/"
            "agent-sandbox's stress tests (PRs 1209, 1276) find a per-node wall of ~4.5-5 "
            "pod launches/s (containerd's RunPodSandbox slows from ~0.13 s to ~1 s under "
            "load); older node density tests started 100 pods on a node in 60-80 s "
            "(kubernetes/kubernetes 22513, 31143), so 5/s is the generous end"
        },
    )
    exec_overhead_s: float = field(
        default=0.1,
        metadata={"help": "assumed: an exec through the API server and kubelet, per action"},
    )
    pending_timeout_s: float = field(
        default=300.0,
        metadata={"help": "assumed: the framework deletes and re-creates a pod pending this long"},
    )
    termination_s: float = field(
        default=30.0,
        metadata={
            "help": "Kubernetes' default grace period: a sandbox whose PID 1 ignores "
            "SIGTERM holds its requests this long after deletion"
        },
    )

    def __post_init__(self) -> None:
        if not (self.cpu_request > 0 and self.cpu_limit >= 1 and self.pod_memory_gb >= 0):
            raise ConfigError("cpu_request > 0, cpu_limit >= 1 and pod_memory_gb >= 0 needed")
        if not (self.bind_qps > 0 and self.node_start_qps > 0 and self.pending_timeout_s > 0):
            raise ConfigError("bind_qps, node_start_qps and pending_timeout_s must be > 0")
        if not (self.startup_s >= 0 and self.exec_overhead_s >= 0 and self.termination_s >= 0):
            raise ConfigError("start-up, exec overhead and termination times must be >= 0")


class PodPhase(IntEnum):
    PENDING = 0
    BOUND = 1  # running once `ready_s` is reached
    TERMINATING = 2


@dataclass
class _Pod:
    trajectory_id: str
    created_s: float
    phase: PodPhase = PodPhase.PENDING
    node: str | None = None
    ready_s: float = math.inf
    action: str | None = None  # the action running in it


class Kubernetes:
    """A pod per trajectory; actions start as soon as their pod is bound."""

    def __init__(self, nodes: Sequence[CpuNode], config: KubeConfig | None = None) -> None:
        if not nodes:
            raise ConfigError("Kubernetes needs at least one node")
        self.config = config or KubeConfig()
        self._cores = {n.name: float(n.num_cores) for n in nodes}
        self._memory = {n.name: n.memory_gb for n in nodes}
        self._requested = dict.fromkeys(self._cores, 0.0)
        self._mem_used = dict.fromkeys(self._cores, 0.0)
        self._pods: dict[str, _Pod] = {}
        self._pending: deque[str] = deque()
        self._terminating: list[tuple[float, str]] = []
        self._waiting: dict[str, ActionSpec] = {}
        self._running: dict[str, str] = {}  # action -> trajectory
        self._next_bind = -math.inf
        self._last_ready = dict.fromkeys(self._cores, -math.inf)  # node -> last pod start
        self.timeouts = 0
        self.pods_created = 0

    # -- views -----------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    def pod_phase(self, trajectory_id: str) -> PodPhase | None:
        pod = self._pods.get(trajectory_id)
        return None if pod is None else pod.phase

    def requested_cpu(self, node: str) -> float:
        return self._requested[node]

    @property
    def pending_pods(self) -> int:
        return len(self._pending)

    # -- ActionPolicy ----------------------------------------------------------------------
    def begin_trajectory(self, trajectory_id: str, now: float) -> None:
        if trajectory_id not in self._pods:
            self._create(trajectory_id, now)

    def submit(self, action: ActionSpec, now: float) -> None:
        if action.kind != ActionKind.CPU_TOOL or CPU not in action.demand:
            raise ConfigError(f"k8s runs CPU actions only; {action.action_id!r} is {action.kind}")
        if action.action_id in self._waiting or action.action_id in self._running:
            raise ConfigError(f"action id {action.action_id!r} is already queued or running")
        pod = self._pods.get(action.trajectory_id)
        if pod is None:
            self._create(action.trajectory_id, now)
        elif pod.phase == PodPhase.TERMINATING:
            raise ConfigError(f"trajectory {action.trajectory_id!r} already ended")
        self._waiting[action.action_id] = action

    def schedule(self, now: float) -> list[Start]:
        self._reap(now)
        self._expire(now)
        self._bind(now)
        return self._start_ready(now)

    def finish(self, action_id: str, now: float) -> None:
        tid = self._running.pop(action_id, None)
        if tid is None:
            raise ConfigError(f"action {action_id!r} is not running")
        self._pods[tid].action = None

    def cancel(self, action_id: str) -> bool:
        return self._waiting.pop(action_id, None) is not None

    def end_trajectory(self, trajectory_id: str, now: float) -> None:
        pod = self._pods.get(trajectory_id)
        if pod is None or pod.phase == PodPhase.TERMINATING:
            return
        if pod.phase == PodPhase.PENDING:
            self._pending.remove(trajectory_id)
            del self._pods[trajectory_id]
            return
        pod.phase = PodPhase.TERMINATING
        heapq.heappush(self._terminating, (now + self.config.termination_s, trajectory_id))

    def next_wakeup(self, now: float) -> float | None:
        times = [t for t, _ in self._terminating[:1]]
        if self._pending:
            times.append(self._pods[self._pending[0]].created_s + self.config.pending_timeout_s)
            if self._node_for() is not None:
                times.append(self._next_bind)
        later = [t for t in times if t > now]
        return min(later) if later else None

    # -- control plane ---------------------------------------------------------------------
    def _create(self, tid: str, now: float) -> None:
        self._pods[tid] = _Pod(tid, now)
        self._pending.append(tid)
        self.pods_created += 1

    def _reap(self, now: float) -> None:
        cfg = self.config
        while self._terminating and self._terminating[0][0] <= now:
            _, tid = heapq.heappop(self._terminating)
            pod = self._pods.pop(tid)
            assert pod.node is not None and pod.action is None, f"pod of {tid} still busy"
            self._requested[pod.node] -= cfg.cpu_request
            self._mem_used[pod.node] -= cfg.pod_memory_gb

    def _expire(self, now: float) -> None:
        """Pods pending past the timeout are deleted and created again at the back."""
        limit = self.config.pending_timeout_s
        for _ in range(len(self._pending)):
            pod = self._pods[self._pending[0]]
            if now - pod.created_s < limit:
                break
            self._pending.rotate(-1)
            pod.created_s = now
            self.timeouts += 1
            self.pods_created += 1

    def _node_for(self) -> str | None:
        """NodeResourcesFit, LeastAllocated: the node left with the most free requests."""
        cfg = self.config
        best, score = None, -math.inf
        for n, cores in self._cores.items():
            cpu = self._requested[n] + cfg.cpu_request
            mem = self._mem_used[n] + cfg.pod_memory_gb
            if cpu > cores + 1e-9 or mem > self._memory[n] + 1e-9:
                continue
            s = (cores - cpu) / cores + (self._memory[n] - mem) / max(self._memory[n], 1e-9)
            if s > score:
                best, score = n, s
        return best

    def _bind(self, now: float) -> None:
        cfg = self.config
        while self._pending and now >= self._next_bind:
            node = self._node_for()
            if node is None:
                return
            pod = self._pods[self._pending.popleft()]
            # The node starts its pods one after another at `node_start_qps` at most.
            ready = max(now + cfg.startup_s, self._last_ready[node] + 1.0 / cfg.node_start_qps)
            self._last_ready[node] = ready
            pod.phase, pod.node, pod.ready_s = PodPhase.BOUND, node, ready
            self._requested[node] += cfg.cpu_request
            self._mem_used[node] += cfg.pod_memory_gb
            assert self._requested[node] <= self._cores[node] + 1e-9, f"{node} over-requested"
            assert self._mem_used[node] <= self._memory[node] + 1e-9, f"{node} out of memory"
            self._next_bind = now + 1.0 / cfg.bind_qps

    def _start_ready(self, now: float) -> list[Start]:
        cfg = self.config
        out = []
        for aid, a in list(self._waiting.items()):
            pod = self._pods[a.trajectory_id]
            if pod.phase != PodPhase.BOUND or pod.node is None:
                continue
            assert pod.action is None, f"pod of {a.trajectory_id} runs two actions at once"
            threads = min(max(a.demand[CPU].values()), cfg.cpu_limit)
            grant = Grant(
                action_id=aid,
                manager="k8s",
                domain=pod.node,
                units=threads,
                memory_gb=cfg.pod_memory_gb,
            )
            overhead = max(pod.ready_s - now, 0.0) + cfg.exec_overhead_s
            out.append(
                Start(
                    action=a,
                    units=threads,
                    domain=pod.node,
                    grants=(grant,),
                    overhead_s=overhead,
                    expected_s=a.duration_s(threads),
                )
            )
            pod.action = aid
            del self._waiting[aid]
            self._running[aid] = a.trajectory_id
        return out


@ACTION_POLICIES.register(ActionPolicyKind.K8S)
def k8s(managers: Sequence[ResourceManager], config: KubeConfig | None = None) -> Kubernetes:
    cm = manager_of(managers, CpuManager, "k8s")
    return Kubernetes(list(cm.nodes.values()), config)
