"""The services a GRPO run stacks, on this machine: a weight relay per job, the cluster service
(the jobs' training, on one node group), the action server (tools and rewards in its sandbox),
vLLM engines serving the model with Loom's weight sync, and the rollout router in front of
them. Engines take half a minute to start, so they start in the background while the jobs warm
up; `engines_ready` says when they (and the router) are up. Everything stops on exit; the
engines' processes die with this one, however it dies."""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self

from loom.core.lifecycle import Started
from loom.rl.grpo.config import GRPOConfig
from loom.runtime.engine.weight_sync import EngineRef

__all__ = ["Stack"]


class Stack(Started):
    def __init__(self, config: GRPOConfig, model_dir: Path) -> None:
        self.config, self.model_dir = config, model_dir
        self.out = config.out
        self.relays: dict[str, Any] = {}
        self.cluster: Any = None
        self.actions: Any = None
        self.router: Any = None
        self.engines: list[Any] = []
        self._pool = ThreadPoolExecutor(max(2, config.services.engines), thread_name_prefix="stack")
        self.engines_ready: Future[list[EngineRef]] | None = None

    def start(self) -> Self:
        from loom.runtime.actions import ActionServerConfig, BackgroundServer
        from loom.runtime.cluster.app import BackgroundCluster, ClusterConfig
        from loom.runtime.relay.app import create_app as relay_app
        from loom.runtime.relay.config import RelayConfig
        from loom.runtime.service import BackgroundApp

        svc = self.config.services
        try:
            self.engines_ready = self._pool.submit(self._start_engines)
            for job in self.config.jobs:
                app = relay_app(RelayConfig(port=0))
                self.relays[job.name] = BackgroundApp(
                    app, "127.0.0.1", 0, name=f"weight relay of {job.name}"
                ).start()
            self.cluster = BackgroundCluster(
                ClusterConfig(
                    port=0, policy=svc.cluster_policy, state_dir=self.out / "state", groups=1
                )
            ).start()
            self.actions = BackgroundServer(
                ActionServerConfig.model_validate(
                    {"port": 0, "workdir": self.out / "actions", "sandbox": svc.sandbox}
                ),
                trust_env=False,
            ).start()
        except BaseException:
            self.stop()
            raise
        return self

    def _cores(self) -> list[str]:
        svc = self.config.services
        if svc.engine_cpus:
            return list(svc.engine_cpus)
        cores = sorted(os.sched_getaffinity(0))
        return [str(cores[-1 - (i % len(cores))]) for i in range(svc.engines)]

    def _start_engines(self) -> list[EngineRef]:
        """The engines (at once), then the router in front of them."""
        from loom.runtime.engine import EngineConfig, EngineProcess
        from loom.runtime.rollout import BackgroundRouter, RolloutServerConfig
        from loom.runtime.rollout import EngineConfig as RoutedEngine

        svc = self.config.services

        def one(cpus: str) -> Any:
            return EngineProcess.start(
                EngineConfig(
                    model=self.model_dir,
                    weight_sync=True,
                    cpus=cpus,
                    max_running=svc.max_running,
                    served_model_name="loom-grpo",
                )
            )

        with ThreadPoolExecutor(svc.engines) as pool:
            futures = [pool.submit(one, c) for c in self._cores()]
        for f in futures:
            if f.exception() is None:
                self.engines.append(f.result())
        for f in futures:
            if (exc := f.exception()) is not None:
                raise exc
        refs = [EngineRef(e.url, f"e{i}") for i, e in enumerate(self.engines)]
        self.router = BackgroundRouter(
            RolloutServerConfig(
                port=0,
                engines=tuple(
                    RoutedEngine(url=r.url, id=r.id, max_running=svc.max_running) for r in refs
                ),
                placement=svc.placement,
                scheduler=svc.scheduler,
                state_dir=self.out / "router",
            )
        ).start()
        return refs

    def stop(self) -> None:
        """Stop everything started (an engine start in flight finishes first, so that what
        it started is stopped too)."""
        self._pool.shutdown(wait=True)
        for svc in (self.router, self.actions, self.cluster, *self.relays.values()):
            if svc is not None:
                svc.stop()
        self.router, self.actions, self.cluster, self.relays = None, None, None, {}
        for engine in self.engines:
            engine.stop()
        self.engines = []
