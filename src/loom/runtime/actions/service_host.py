"""GPU services via evict-on-execution (§5.3): an invariant host-memory copy of every service's
weights, and device copies of exactly the instances the GPU manager keeps resident — restored
when it grants a chunk the service is not cached on, dropped when it evicts them.

With CUDA, node GPUs are CUDA devices (nodes take consecutive device ranges) and the host copy
is pinned; without it every GPU is the host CPU, and a restore still copies every tensor into
a fresh module, so the logic and the timings' shape are the same.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue

from loom.actions.managers.gpu import GpuNode, ServiceSpec
from loom.core.actions import ActionStatus
from loom.core.errors import ConfigError
from loom.runtime.actions.config import GpuNodeConfig, GpuServiceConfig
from loom.runtime.actions.executor import ExecContext
from loom.runtime.actions.record import Outcome
from loom.runtime.actions.service_models import SERVICE_MODELS, ServiceModel, import_torch

__all__ = ["Instance", "ServiceHost"]

log = logging.getLogger(__name__)

CPU_TIER_MEMORY_GB = 1.0  # device memory of the default node on the CPU tier (a budget only)


@dataclass(frozen=True)
class Instance:
    """A service at one degree on one chunk, as `GpuManager.cached` names it."""

    node: str
    service: str
    dop: int
    start: int


class ServiceHost:
    """Host backups and device replicas of torch services; an `Executor` of GPU actions."""

    def __init__(
        self, services: Sequence[GpuServiceConfig], nodes: Sequence[GpuNodeConfig]
    ) -> None:
        self._torch = torch = import_torch()
        self.cuda = bool(torch.cuda.is_available())
        if not self.cuda:
            # NOTE: on the CPU tier the services share the host's cores with pinned CPU
            # actions; one intra-op thread keeps them from spreading over every core.
            torch.set_num_threads(1)
        self.nodes = tuple(nodes) or (self._default_node(),)
        self._devices = self._map_devices(self.nodes)
        self._models: dict[str, ServiceModel] = {
            s.name: SERVICE_MODELS[s.model](s) for s in services
        }
        self._configs = {s.name: s for s in services}
        self._backup = {name: self._backup_of(m) for name, m in self._models.items()}
        self._resident: dict[Instance, list[tuple[Any, Any]]] = {}
        self._lock = threading.Lock()
        self.restores = 0

    # -- setup -----------------------------------------------------------------------------
    def _default_node(self) -> GpuNodeConfig:
        torch = self._torch
        if not self.cuda:
            return GpuNodeConfig(name="gpu0", gpus=1, memory_gb=CPU_TIER_MEMORY_GB)
        count = torch.cuda.device_count()
        gpus = 1 << (count.bit_length() - 1)
        mem = min(torch.cuda.get_device_properties(i).total_memory for i in range(gpus))
        return GpuNodeConfig(name="gpu0", gpus=gpus, memory_gb=mem / 2**30)

    def _map_devices(self, nodes: Sequence[GpuNodeConfig]) -> dict[str, list[Any]]:
        torch = self._torch
        if not self.cuda:
            return {n.name: [torch.device("cpu")] * n.gpus for n in nodes}
        count, out, nxt = torch.cuda.device_count(), {}, 0
        for n in nodes:
            out[n.name] = [torch.device("cuda", nxt + g) for g in range(n.gpus)]
            nxt += n.gpus
        if nxt > count:
            raise ConfigError(f"GPU nodes list {nxt} GPUs; this machine has {count} CUDA devices")
        return out

    def _backup_of(self, model: ServiceModel) -> dict[str, Any]:
        state = {k: t.detach().clone() for k, t in model.build().state_dict().items()}
        if self.cuda:
            state = {k: t.pin_memory() for k, t in state.items()}
        return state

    # -- what the GPU manager needs --------------------------------------------------------
    def gpu_nodes(self) -> list[GpuNode]:
        return [
            GpuNode(
                name=n.name,
                gpus=n.gpus,
                memory_gb=n.memory_gb,
                h2d_gbs=n.h2d_gbs,
                restore_fixed_s=n.restore_fixed_s,
            )
            for n in self.nodes
        ]

    def service_specs(self) -> list[ServiceSpec]:
        """Each service's weights as measured from its tensors."""
        return [
            ServiceSpec(
                name=name,
                weights_gb=sum(t.numel() * t.element_size() for t in state.values()) / 2**30,
                working_gb=self._configs[name].working_gb,
                dops=self._configs[name].dops,
            )
            for name, state in self._backup.items()
        ]

    def check_input(self, service: str, payload: JsonValue) -> None:
        if service in self._models:
            self._models[service].check_input(payload)

    # -- residency -------------------------------------------------------------------------
    def sync(self, node: str, cached: Sequence[tuple[str, int, int]]) -> list[Instance]:
        """Drop the device copies of `node`'s instances the manager no longer caches."""
        keep = {Instance(node, s, d, g) for s, d, g in cached}
        with self._lock:
            gone = [i for i in self._resident if i.node == node and i not in keep]
            for inst in gone:
                del self._resident[inst]
        for inst in gone:
            log.debug("evicted %s", inst)
        return gone

    def resident(self) -> list[Instance]:
        with self._lock:
            return sorted(self._resident, key=lambda i: (i.node, i.start, i.service, i.dop))

    def _restore(self, inst: Instance) -> None:
        """Copy the host state into fresh modules on each device of the chunk (blocking)."""
        model, state = self._models[inst.service], self._backup[inst.service]
        replicas = []
        for gpu in range(inst.start, inst.start + inst.dop):
            device = self._devices[inst.node][gpu]
            module = model.skeleton()
            weights = {k: t.to(device, non_blocking=True, copy=True) for k, t in state.items()}
            module.load_state_dict(weights, assign=True)
            replicas.append((module.eval(), device))
        if self.cuda:
            for _, device in replicas:
                self._torch.cuda.synchronize(device)
        with self._lock:
            self._resident[inst] = replicas
            self.restores += 1

    def _infer(self, inst: Instance, payload: JsonValue) -> JsonValue:
        with self._lock:
            replicas = self._resident[inst]
        result = self._models[inst.service].infer(replicas, payload)
        if self.cuda:
            for _, device in replicas:
                self._torch.cuda.synchronize(device)
        return result

    # -- Executor --------------------------------------------------------------------------
    async def run(self, ctx: ExecContext) -> Outcome:
        call, start = ctx.request.service, ctx.start
        assert call is not None and start.gpus, "a GPU action has a service and GPUs"
        inst = Instance(start.domain, call.name, len(start.gpus), start.gpus[0])
        with self._lock:
            restore = start.overhead_s > 0 or inst not in self._resident
        if restore:
            await _in_thread(self._restore, inst)
        ctx.started()
        t0 = time.monotonic()
        fut = asyncio.ensure_future(asyncio.to_thread(self._infer, inst, call.input))
        try:
            result = await asyncio.wait_for(asyncio.shield(fut), ctx.timeout_s)
        except TimeoutError:
            await _settle(fut)  # the GPUs stay busy until the call returns
            return Outcome(
                status=ActionStatus.TIMED_OUT,
                error=f"timed out after {ctx.timeout_s:g} s",
                restored=restore,
            )
        except asyncio.CancelledError:
            await _settle(fut)
            raise
        except Exception as exc:  # the model rejected its input
            return Outcome(
                status=ActionStatus.FAILED, error=f"{type(exc).__name__}: {exc}", restored=restore
            )
        log.debug("%s ran in %.4f s", inst, time.monotonic() - t0)
        return Outcome(status=ActionStatus.SUCCEEDED, result=result, restored=restore)

    async def close(self) -> None:
        with self._lock:
            self._resident.clear()


async def _in_thread(fn: Any, *args: Any) -> None:
    """Run a blocking step; if cancelled meanwhile, still wait for it to end."""
    fut = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        await asyncio.shield(fut)
    except asyncio.CancelledError:
        await _settle(fut)
        raise


async def _settle(fut: asyncio.Future[Any]) -> None:
    """Wait for a running thread call to end, whatever it returns or raises."""
    await asyncio.gather(fut, return_exceptions=True)
