"""The Ray actors of a rollout deployment: the router, and one actor per engine that starts the
engine's process on its node and registers it with the router. Plain classes: `ray_deploy`
wraps them with `ray.remote` when it deploys, so importing this module needs no Ray."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import httpx

from loom.runtime.rollout.config import EngineKind, RolloutServerConfig
from loom.runtime.rollout.server import BackgroundRouter

__all__ = ["EngineActor", "EngineLauncher", "EngineSpec", "RouterActor"]

log = logging.getLogger(__name__)


class EngineLauncher(StrEnum):
    """What an engine actor starts."""

    VLLM = "vllm"  # vLLM's OpenAI server (loom.runtime.engine.EngineProcess)
    STANDIN = "standin"  # the stand-in SGLang engine: no model, starts in a second (tests)


_DIALECT = {EngineLauncher.VLLM: EngineKind.VLLM, EngineLauncher.STANDIN: EngineKind.SGLANG}


def _node_ip() -> str:
    import ray

    return str(ray.util.get_node_ip_address())


class RouterActor:
    """The rollout router (`BackgroundRouter`) in a Ray actor, bound to `host` (None: the
    node's IP, so that engines and clients on other nodes reach it). It also keeps the
    deployment's record (placement group, engine actor names) so that any driver can find
    the whole deployment from the router's name."""

    def __init__(self, config: RolloutServerConfig, host: str | None) -> None:
        settings = config.with_overrides(host=host or _node_ip())
        self._router = BackgroundRouter(settings).start()
        self._record: dict[str, Any] = {}

    def url(self) -> str:
        return self._router.url

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self._router.call(lambda driver: driver.stats())
        return stats

    def remember(self, record: dict[str, Any]) -> None:
        self._record = record

    def record(self) -> dict[str, Any]:
        return self._record

    def stop(self) -> None:
        self._router.stop()


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """How an engine actor starts its engine and names it to the router."""

    id: str
    launcher: EngineLauncher
    tp: int
    max_running: int
    node: int  # the node's index in the deployment, for the router's migration costs
    host: str | None  # None: the node's IP
    vllm: Any = None  # a loom.runtime.engine.EngineConfig template (VLLM only)
    standin_args: tuple[str, ...] = ()


class EngineActor:
    """One engine: `start(router_url)` launches its process on this node (inheriting the GPUs
    Ray gave this actor in CUDA_VISIBLE_DEVICES), waits until it is healthy and registers it
    with the router (`POST /v1/engines`, the route any launcher uses). Runs with two threads
    so that `stop()` can end an engine still starting."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self._engine: Any = None  # StandinProcess or EngineProcess
        self._stopped = threading.Event()

    def start(self, router_url: str) -> dict[str, Any]:
        spec = self.spec
        host = spec.host or _node_ip()
        engine = self._launch(host)
        self._engine = engine
        if self._stopped.is_set():  # stop() came while it started
            engine.stop()
            raise RuntimeError(f"engine {spec.id} was stopped while it started")
        body = {
            "url": engine.url,
            "id": spec.id,
            "kind": _DIALECT[spec.launcher].value,
            "tp": spec.tp,
            "max_running": spec.max_running,
            "node": spec.node,
        }
        resp = httpx.post(f"{router_url}/v1/engines", json=body, timeout=60, trust_env=False)
        if resp.status_code != 201:
            raise RuntimeError(
                f"the router refused engine {spec.id} at {engine.url}: "
                f"{resp.status_code} {resp.text}"
            )
        import ray

        return {
            "id": spec.id,
            "url": engine.url,
            "node_ip": _node_ip(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        }

    def _launch(self, host: str) -> Any:
        spec = self.spec
        if spec.launcher is EngineLauncher.STANDIN:
            from loom.runtime.rollout.standin import StandinProcess

            args = ("--host", host, "--max-running", str(spec.max_running), *spec.standin_args)
            return StandinProcess(*args)
        from loom.runtime.engine import EngineConfig, EngineProcess

        template = spec.vllm or EngineConfig()
        cfg = replace(
            template,
            host=host,
            port=0,
            max_running=spec.max_running,
            tensor_parallel_size=spec.tp,
        )
        return EngineProcess.start(cfg)

    def stop(self) -> None:
        """End the engine's process (and one still starting: the launcher's registry of live
        engines holds it before it is healthy)."""
        self._stopped.set()
        if self._engine is not None:
            self._engine.stop()
        elif self.spec.launcher is EngineLauncher.VLLM:
            from loom.runtime.engine.launcher import stop_all

            stop_all()
