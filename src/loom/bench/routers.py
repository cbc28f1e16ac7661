"""The routers a benchmark sends its agents to, one kind per class behind one interface
(`Router`): Loom's router served in a process of its own (as users run it), Loom's router in
a thread of this process, the peer routers (`loom.bench.peers`: sglang-router, smg,
vllm-router), and a bare aiohttp proxy (the floor of Loom's HTTP stack). Each is a
context manager; inside it the router answers at `url`, and `pid` is the process whose CPU is
the router's (None: this one's)."""

from __future__ import annotations

import importlib.util
import sys
import time
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

import httpx

from loom.bench.peers import PEERS, PeerUnavailableError
from loom.bench.process import ServerProcess, ServerStartError, free_port
from loom.core.lifecycle import Started

if TYPE_CHECKING:
    from loom.runtime.rollout import BackgroundRouter, RolloutServerConfig

__all__ = [
    "SGLANG_POLICIES",
    "SGLANG_ROUTER_HINT",
    "PeerRouter",
    "PeerUnavailableError",
    "ProxyRouter",
    "Router",
    "ServedRouter",
    "SglangRouter",
    "ThreadRouter",
    "sglang_router_available",
]

SGLANG_ROUTER_HINT = "pip install sglang-router"
SGLANG_POLICIES = PEERS["sglang"].policies


class Router(Started):
    """A router on loopback; `url` and `pid` once entered."""

    url: str = ""

    @property
    @abstractmethod
    def pid(self) -> int | None:
        """The router's own process, or None where it runs in this one."""


class _ProcessRouter(Router):
    """A router served by `cmd` in a process of its own at `url`."""

    def __init__(self, cmd: Sequence[str], url: str, name: str, **kw: Any) -> None:
        self.url = url
        self._server = ServerProcess(list(cmd), url, name=name, **kw)

    @property
    def pid(self) -> int:
        return self._server.pid

    def start(self) -> Self:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()


class ServedRouter(_ProcessRouter):
    """`loom serve rollout --port P *flags` in a process of its own; `env`: its environment
    (e.g. PYTHONPATH of another checkout's `src`, to compare with an earlier router)."""

    def __init__(self, flags: Sequence[str], *, env: Mapping[str, str] | None = None) -> None:
        port = free_port()
        cmd = [sys.executable, "-m", "loom.cli", "serve", "rollout", "--port", str(port), *flags]
        super().__init__(cmd, f"http://127.0.0.1:{port}", "loom serve rollout", env=env)


class ProxyRouter(_ProcessRouter):
    """The floor of a router on Loom's HTTP stack (`loom.bench.proxy`): a bare aiohttp
    proxy to one engine, in a process of its own."""

    def __init__(self, engine: str) -> None:
        port = free_port()
        cmd = [sys.executable, "-m", "loom.bench.proxy", "--port", str(port), "--engine", engine]
        super().__init__(cmd, f"http://127.0.0.1:{port}", "aiohttp proxy")


class ThreadRouter(Router):
    """Loom's router in a thread of this process (`BackgroundRouter`)."""

    def __init__(self, config: RolloutServerConfig) -> None:
        self.config = config
        self._router: BackgroundRouter | None = None

    @property
    def pid(self) -> None:
        return None

    def start(self) -> Self:
        from loom.runtime.rollout import BackgroundRouter

        self._router = BackgroundRouter(self.config).start()
        self.url = self._router.url
        return self

    def stop(self) -> None:
        if self._router is not None:
            self._router.stop()
            self._router = None


def sglang_router_available() -> bool:
    """Whether sglang-router is installed here (without importing it)."""
    return importlib.util.find_spec("sglang_router") is not None


class PeerRouter(Router):
    """A peer router (`loom.bench.peers.PEERS`) over `engines` with one of its policies, ready
    once it has registered every engine. PeerUnavailableError where it is not installed."""

    def __init__(self, peer: str, engines: Sequence[str], policy: str) -> None:
        self.peer = PEERS[peer]
        if policy not in self.peer.policies:
            raise ValueError(
                f"unknown {peer} policy {policy!r}; one of {', '.join(self.peer.policies)}"
            )
        self.engines = list(engines)
        self.policy = policy
        self._server: ServerProcess | None = None

    @property
    def pid(self) -> int:
        assert self._server is not None, f"{self.peer.name} is not started"
        return self._server.pid

    def start(self) -> Self:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = [
            *self.peer.command(), "--worker-urls", *self.engines,
            "--port", str(port), "--host", "127.0.0.1", "--policy", self.policy,
            "--prometheus-port", str(free_port()),  # its default (29000) may be taken
        ]  # fmt: skip
        self._server = ServerProcess(cmd, self.url, name=self.peer.name).start()
        try:
            self._wait_workers()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_workers(self, timeout_s: float = 60.0) -> None:
        """The peers answer /health before they have registered their workers (a background
        workflow); requests before then get 503 no_available_workers."""
        n = len(self.engines)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            workers = httpx.get(self.url + "/workers", timeout=5).json().get("workers", [])
            if len(workers) == n and all(w.get("is_healthy", True) for w in workers):
                return
            time.sleep(0.1)
        raise ServerStartError(
            f"{self.peer.name} at {self.url} had not registered {n} workers in {timeout_s:.0f} s"
        )

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


class SglangRouter(PeerRouter):
    """sglang-router over `engines` with one of its policies (`SGLANG_POLICIES`)."""

    def __init__(self, engines: Sequence[str], policy: str = "round_robin") -> None:
        super().__init__("sglang", engines, policy)
