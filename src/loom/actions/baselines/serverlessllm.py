"""ServerlessLLM-style model-as-a-service (Fu et al., OSDI'24), the second GPU baseline of
§6.3: a shared GPU pool where each model runs as instances of one fixed degree, loaded on
demand and scaled by ServerlessLLM's concurrency autoscaler (its `sllm` defaults: target one
request per instance, zero to ten instances, scale down after `keep_alive` idle seconds).

Requests of a model queue first come, first served and run one at a time on an idle instance
of it. Scale-up takes free slots for the models whose oldest request waits longest first; a
model that cannot get a slot blocks later ones (FCFS). A load starts an inference engine and
streams the weights from host memory (ServerlessLLM's loader); Tangram's GPU manager instead
keeps the engine's state and only moves weights (§5.3), and picks the degree per action.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from loom.actions.baselines.common import manager_of
from loom.actions.managers.base import Grant, ResourceManager
from loom.actions.managers.gpu import GpuManager, GpuNode, ServiceSpec
from loom.actions.policy import ACTION_POLICIES, ActionPolicyKind, Start
from loom.core.actions import ActionKind, ActionSpec
from loom.core.errors import ConfigError

__all__ = ["Serverless", "ServerlessConfig"]


@dataclass(frozen=True, kw_only=True)
class ServerlessConfig:
    degree: int = field(
        default=4, metadata={"help": "GPUs per instance (§6.1 deploys each model on four)"}
    )
    target: int = field(
        default=1, metadata={"help": "requests per instance the autoscaler aims at (sllm default)"}
    )
    max_instances: int = field(default=10, metadata={"help": "per model (sllm default)"})
    keep_alive_s: float = field(
        default=0.0, metadata={"help": "idle time before an instance is unloaded (sllm default)"}
    )
    startup_s: float = field(
        default=5.0,
        metadata={
            "help": "assumed: starting an inference engine (process, CUDA context, TP "
            "group) for each load"
        },
    )
    loader_gbs: float = field(
        default=50.0,
        metadata={
            "help": "per GPU: ServerlessLLM's H100 benchmark loads Qwen3-32B (64 GB) "
            "from host memory in ~1.2 s"
        },
    )

    def __post_init__(self) -> None:
        if self.degree < 1 or self.degree & (self.degree - 1):
            raise ConfigError(f"degree must be a power of two, got {self.degree}")
        if self.target < 1 or self.max_instances < 1:
            raise ConfigError("target and max_instances must be >= 1")
        if not (self.startup_s >= 0 and self.loader_gbs > 0 and self.keep_alive_s >= 0):
            raise ConfigError("startup_s and keep_alive_s must be >= 0, loader_gbs > 0")


@dataclass
class _Slot:
    node: str
    start: int
    size: int
    service: str | None = None  # the model instance loaded here
    busy: str | None = None
    idle_since: float = 0.0

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(range(self.start, self.start + self.size))


class Serverless:
    def __init__(
        self,
        nodes: Sequence[GpuNode],
        services: Mapping[str, ServiceSpec],
        config: ServerlessConfig | None = None,
    ) -> None:
        self.config = cfg = config or ServerlessConfig()
        self.services = dict(services)
        self._slots = [
            _Slot(n.name, off, cfg.degree)
            for n in nodes
            if cfg.degree <= n.gpus
            for off in range(0, n.gpus, cfg.degree)
        ]
        if not self._slots:
            raise ConfigError(f"no node has {cfg.degree} GPUs for an instance")
        self._mem = min(n.memory_gb for n in nodes)
        self._queues: dict[str, deque[tuple[int, ActionSpec]]] = {}
        self._running: dict[str, _Slot] = {}
        self._seq = 0
        self.loads = 0

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    @property
    def running(self) -> int:
        return len(self._running)

    def submit(self, action: ActionSpec, now: float) -> None:
        svc = self.services.get(action.service or "")
        if action.kind != ActionKind.GPU_SERVICE or svc is None:
            raise ConfigError(f"action {action.action_id!r}: unknown service {action.service!r}")
        if svc.memory_per_gpu(self.config.degree) > self._mem:
            raise ConfigError(f"service {svc.name!r} does not fit {self.config.degree} GPUs")
        if action.action_id in self._running:
            raise ConfigError(f"action id {action.action_id!r} is already running")
        self._queues.setdefault(svc.name, deque()).append((self._seq, action))
        self._seq += 1

    def schedule(self, now: float) -> list[Start]:
        self._scale_down(now, expired_before=True)  # went idle earlier and timed out since
        out = self._serve_warm(now)
        self._scale_down(now)
        out += self._scale_up(now)
        return out

    def _serve_warm(self, now: float) -> list[Start]:
        out = []
        for s in self._slots:
            q = self._queues.get(s.service or "")
            if s.service is not None and s.busy is None and q:
                out.append(self._run(s, q.popleft()[1], 0.0, now))
        return out

    def _scale_down(self, now: float, *, expired_before: bool = False) -> None:
        """Unload idle instances whose keep-alive ran out (with `expired_before`, only those
        that ran out strictly before now, whatever is queued)."""
        keep = self.config.keep_alive_s
        for s in self._slots:
            if s.service is None or s.busy is not None:
                continue
            idle = now - s.idle_since
            if idle > keep if expired_before else idle >= keep and not self._queues.get(s.service):
                s.service = None

    def _scale_up(self, now: float) -> list[Start]:
        cfg = self.config
        out: list[Start] = []
        waiting = sorted((q[0][0], name) for name, q in self._queues.items() if q)
        for _, name in waiting:
            q = self._queues[name]
            have = sum(1 for s in self._slots if s.service == name)
            busy = sum(1 for s in self._slots if s.service == name and s.busy is not None)
            want = min(cfg.max_instances, math.ceil((len(q) + busy) / cfg.target))
            while have < want and q:
                slot = next((s for s in self._slots if s.service is None), None)
                if slot is None:
                    return out  # FCFS: the oldest waiting model holds back the rest
                slot.service = name
                self.loads += 1
                load_s = cfg.startup_s + self.services[name].weights_gb / slot.size / cfg.loader_gbs
                out.append(self._run(slot, q.popleft()[1], load_s, now))
                have += 1
        return out

    def _run(self, slot: _Slot, a: ActionSpec, overhead: float, now: float) -> Start:
        slot.busy = a.action_id
        self._running[a.action_id] = slot
        grant = Grant(
            action_id=a.action_id,
            manager="serverless",
            domain=slot.node,
            units=slot.size,
            gpus=slot.gpus,
            overhead_s=overhead,
        )
        return Start(
            action=a,
            units=slot.size,
            domain=slot.node,
            grants=(grant,),
            overhead_s=overhead,
            expected_s=a.duration_s(slot.size),
        )

    def finish(self, action_id: str, now: float) -> None:
        slot = self._running.pop(action_id, None)
        if slot is None:
            raise ConfigError(f"action {action_id!r} is not running")
        slot.busy, slot.idle_since = None, now

    def cancel(self, action_id: str) -> bool:
        for q in self._queues.values():
            for item in q:
                if item[1].action_id == action_id:
                    q.remove(item)
                    return True
        return False

    def end_trajectory(self, trajectory_id: str, now: float) -> None:
        return None

    def next_wakeup(self, now: float) -> float | None:
        """When an idle instance's keep-alive runs out while some model waits for a slot."""
        if not any(self._queues.values()):
            return None
        ends = [
            s.idle_since + self.config.keep_alive_s
            for s in self._slots
            if s.service is not None and s.busy is None
        ]
        later = [t for t in ends if t > now]
        return min(later) if later else None


@ACTION_POLICIES.register(ActionPolicyKind.SERVERLESSLLM)
def serverlessllm(
    managers: Sequence[ResourceManager], config: ServerlessConfig | None = None
) -> Serverless:
    gm = manager_of(managers, GpuManager, "serverlessllm")
    return Serverless(gm.nodes, gm.services, config)
