"""The engines the router starts itself, in Heddle's planned layout (`FleetConfig`).

At startup the fleet plans the layout (`layout.planned_layout`: Heddle's annealer over the
router's history, or a fixed one), starts one engine per slot (an emulated GPU engine at the
slot's degree on its node, or vLLM on the slot's GPUs) and registers each with the router at
its degree. `plan()` (`POST /v1/fleet/plan`, between steps) plans again from the history,
for a batch the size of the latest declared one:
engines the new layout does not keep are drained (their waiting turns go elsewhere at once,
their running ones finish, or move after `drain_timeout_s`) and stopped, the new ones are
started and registered, and the answer says what changed and how long it took. When the
router stops, every engine it started stops with it (each is tethered to the router's
process, so even a SIGKILL of the router leaves none running).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from loom.core.errors import Conflict
from loom.runtime.rollout.config import EngineConfig, EngineKind, FleetConfig
from loom.runtime.rollout.layout import (
    EMULATED_MAX_RUNNING,
    Change,
    Slot,
    change,
    planned_layout,
    slots,
)

if TYPE_CHECKING:
    from loom.runtime.rollout.driver import RolloutDriver

__all__ = ["PlannedFleet"]

log = logging.getLogger("loom.rollout")

POLL_S = 0.05


class _Running(Protocol):
    @property
    def url(self) -> str: ...

    def stop(self) -> None: ...


class PlannedFleet:
    """Starts, replaces and stops the router's own engines; all methods on the router's loop."""

    def __init__(self, config: FleetConfig, driver: RolloutDriver) -> None:
        self.config = config
        self.driver = driver
        self.engines: dict[Slot, _Running] = {}
        self.changes: list[dict[str, Any]] = []
        self._lock = asyncio.Lock()

    @property
    def layout(self) -> tuple[int, ...]:
        return tuple(s.tp for s in self.engines)

    async def start(self) -> None:
        await self.plan()

    async def plan(self, layout: tuple[int, ...] | None = None) -> dict[str, Any]:
        """Plan the layout again (or take `layout`) and move the fleet to it: what changed,
        and the seconds it took (wall, and in GPU seconds for emulated engines)."""
        async with self._lock:
            began = time.monotonic()
            before = self.layout
            if layout is None:
                history = list(self.driver.predictor.history)
                model, gpu = self.driver.config.model, self.driver.config.gpu
                plan = functools.partial(
                    planned_layout,
                    self.config,
                    history,
                    model,
                    gpu,
                    batch=self.driver.last_batch,
                    max_running=self.config.max_running or EMULATED_MAX_RUNNING,
                )
                layout = await asyncio.to_thread(plan)
            step = change(
                list(self.engines), slots(layout, self.config.gpus, self.config.gpus_per_node)
            )
            await self._apply(step)
            wall = time.monotonic() - began
            report = {
                "before": list(before),
                "layout": list(self.layout),
                "kept": [s.name for s in step.keep],
                "stopped": [s.name for s in step.stop],
                "started": [s.name for s in step.start],
                "seconds": wall,
                "gpu_seconds": wall / self.config.time_scale if self.config.emulate else wall,
            }
            self.changes.append(report)
            log.info("fleet layout %s -> %s in %.1f s", before, self.layout, wall)
            return report

    def view(self) -> dict[str, Any]:
        return {
            "gpus": self.config.gpus,
            "layout": list(self.layout),
            "engines": [
                {"id": s.name, "tp": s.tp, "gpus": list(s.gpus), "node": s.node, "url": e.url}
                for s, e in self.engines.items()
            ],
            "changes": self.changes,
        }

    async def close(self) -> None:
        """Stop every engine this fleet started."""
        running, self.engines = list(self.engines.values()), {}
        await asyncio.gather(*(asyncio.to_thread(e.stop) for e in running))

    # ---- carrying out a change ------------------------------------------------------------

    async def _apply(self, step: Change) -> None:
        for s in step.stop:
            await self._retire(s)
        started = await asyncio.gather(
            *(asyncio.to_thread(self._launch, s) for s in step.start), return_exceptions=True
        )
        failed = [r for r in started if isinstance(r, BaseException)]
        for s, got in zip(step.start, started, strict=True):
            if not isinstance(got, BaseException):
                self.engines[s] = got
        if failed:
            raise failed[0]
        for s in step.start:
            await self.driver.add_engine(
                EngineConfig(
                    url=self.engines[s].url,
                    id=s.name,
                    kind=EngineKind.VLLM,
                    tp=s.tp,
                    node=s.node,
                    max_running=self.config.max_running,
                )
            )
        self.engines = dict(sorted(self.engines.items(), key=lambda kv: kv[0].gpus[0]))

    async def _retire(self, s: Slot) -> None:
        """Drain the engine of `s` (its turns finish there, or move after the drain timeout),
        then stop it."""
        eid = s.name
        with contextlib.suppress(Conflict, LookupError):
            self.driver.remove_engine(eid, leaving=True)
        deadline = time.monotonic() + self.config.drain_timeout_s
        while eid in self.driver.engines and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        if eid in self.driver.engines:
            self.driver.remove_engine(eid, force=True, leaving=True)
        engine = self.engines.pop(s)
        await asyncio.to_thread(engine.stop)

    def _launch(self, s: Slot) -> _Running:
        """Start the engine of `s` (blocking: on a thread)."""
        cfg = self.config
        if cfg.emulate is not None:
            from loom.runtime.emulate import EmulatedProcess

            return EmulatedProcess(
                f"{cfg.emulate}:tp{s.tp}",
                "--node",
                str(s.node),
                "--time-scale",
                str(cfg.time_scale),
                *cfg.engine_args,
            )
        from loom.runtime.engine import EngineProcess
        from loom.runtime.engine.launcher import EngineConfig as VllmConfig

        return EngineProcess.start(
            VllmConfig(
                tensor_parallel_size=s.tp,
                devices=s.devices(cfg.gpus_per_node),
                extra_args=cfg.engine_args,
            )
        )
