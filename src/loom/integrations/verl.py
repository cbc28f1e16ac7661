"""A verl rollout load balancer that places trajectories with a Loom placement policy.

verl's agent loop asks a pluggable balancer (`verl.workers.rollout.router`: the
`RequestLoadBalancer` protocol, registered in `LoadBalancerRegistry`) for a server before
every turn — `acquire_server(request_id, prompt_ids)` with the same `request_id` for every
turn of one sample — and calls that server directly, then `release_server`. This balancer
answers with Heddle's placement (or cache_aware, least_load, hybrid): trajectories join the
presorted DP as they arrive, a trajectory stays on its home server between turns, and a
trajectory idle for `idle_s` (verl does not say when one ends) is finished.

It brings Loom's placement, not its scheduling: verl talks to the server itself, so PPS and
preemption need the router in front of the engines instead (`loom serve rollout`).

Use it by importing this module in the trainer's process (it registers "loom" when verl is
importable) and setting `actor_rollout_ref.rollout.router_strategy=loom`; optional
`router_config`: placement, tp (per server id), model, gpu, idle_s.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from loom.core.errors import ConfigError
from loom.rollout.policy import PlacementKind
from loom.runtime.rollout.config import RolloutServerConfig
from loom.runtime.rollout.driver import make_router, stable_id
from loom.runtime.rollout.state import Trajectory

__all__ = ["LoomLoadBalancer"]


@dataclass(eq=False)
class _Server:
    idx: int
    id: str
    handle: Any
    tp: int
    node: int = 0
    load: int = 0
    trajectories: Mapping[int, Trajectory] | None = None

    def cached_tokens(self, traj_id: int) -> int:
        t = (self.trajectories or {}).get(traj_id)
        return t.context if t is not None and t.host == self.idx else 0


class LoomLoadBalancer:
    """verl's `RequestLoadBalancer`, driving a Loom `Router` policy."""

    def __init__(
        self,
        servers: dict[str, Any],
        config: dict[str, Any] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        cfg = dict(config or {})
        try:
            settings = RolloutServerConfig(
                placement=PlacementKind(cfg.get("placement", "heddle")),
                model=cfg.get("model", "qwen3-14b"),
                gpu=cfg.get("gpu", "h100"),
            )
        except ValueError as exc:
            raise ConfigError(f"invalid loom router_config: {exc}") from None
        self._tp: dict[str, int] = {str(k): int(v) for k, v in (cfg.get("tp") or {}).items()}
        self.idle_s = float(cfg.get("idle_s", 600.0))
        self.router = make_router(settings)
        self.clock = clock
        self._idx = itertools.count()
        self._tids = itertools.count()
        self._servers: dict[str, _Server] = {}
        self._trajs: dict[str, Trajectory] = {}
        self._by_tid: dict[int, Trajectory] = {}
        self._inflight: dict[str, str] = {}  # request id -> server id
        self.add_servers(servers)

    def _views(self) -> list[_Server]:
        return sorted(self._servers.values(), key=lambda s: (-s.tp, s.idx))

    def add_servers(self, servers: dict[str, Any]) -> None:
        for sid, handle in servers.items():
            if sid not in self._servers:
                self._servers[sid] = _Server(
                    next(self._idx), sid, handle, self._tp.get(sid, 1), trajectories=self._by_tid
                )
        if self._servers:
            self.router.start([], self._views())

    def remove_servers(self, server_ids: list[str]) -> None:
        for sid in server_ids:
            self._servers.pop(sid, None)
        if self._servers:
            self.router.start([], self._views())

    def get_all_servers(self) -> list[str]:
        return list(self._servers)

    def acquire_server(
        self, request_id: str, prompt_ids: list[int] | None = None
    ) -> tuple[str, Any]:
        if not self._servers:
            raise RuntimeError("no servers to route to")
        now = self.clock()
        self._expire(now)
        t = self._trajs.get(request_id)
        views = self._views()
        if t is None:
            prompt = prompt_ids or []
            t = Trajectory(
                traj_id=next(self._tids),
                key=request_id,
                prompt_id=stable_id(",".join(map(str, prompt[:256]))),
                group=None,
                declared=False,
                first_arrival_s=now,
                prompt_tokens=len(prompt),
                started=True,
            )
            self._trajs[request_id] = t
            self._by_tid[t.traj_id] = t
            self.router.join(t, views)
        t.turn_arrival_s = t.last_seen_s = now
        choice = self.router.route(t, views, now)
        server = next((s for s in views if s.idx == choice), None)
        if server is None:
            server = min(views, key=lambda s: (s.load, s.idx))
        server.load += 1
        t.host = server.idx
        self._inflight[request_id] = server.id
        return server.id, server.handle

    def release_server(
        self, server_id: str, prompt_len: int = 0, request_id: str | None = None
    ) -> None:
        server = self._servers.get(server_id)
        if server is not None and server.load > 0:
            server.load -= 1
        if request_id is None:
            return
        self._inflight.pop(request_id, None)
        t = self._trajs.get(request_id)
        if t is not None:
            t.steps_done += 1
            t.context = max(t.context, prompt_len)
            t.last_seen_s = self.clock()
            self.router.migrate(t, self._views(), t.last_seen_s)  # its next turn: the new home
        for tid in self.router.stale():  # trajectories between turns move at once
            other = self._by_tid.get(tid)
            if other is not None and other.key not in self._inflight:
                self.router.migrate(other, self._views(), self.clock())

    def _expire(self, now: float) -> None:
        for key, t in list(self._trajs.items()):
            if key not in self._inflight and now - t.last_seen_s > self.idle_s:
                del self._trajs[key]
                del self._by_tid[t.traj_id]
                self.router.finish(t)

    def get_status(self) -> dict[str, Any]:
        return {
            "placement": type(self.router).__name__,
            "servers": {s.id: {"tp": s.tp, "inflight": s.load} for s in self._servers.values()},
            "trajectories": len(self._trajs),
        }


def _register() -> None:
    try:
        from verl.workers.rollout.router.base import LoadBalancerRegistry
    except ImportError:  # verl is not installed: nothing to register with
        return
    LoadBalancerRegistry.register("loom")(LoomLoadBalancer)


_register()
