"""verl's rollout load balancer, placing trajectories with a Loom placement policy.

verl 0.9.1 (`verl.workers.rollout.router`) asks one balancer — a Ray actor shared by every
agent-loop worker — for a server before every turn: `acquire_server(request_id, **fields)`
with the same `request_id` for every turn of one trajectory and the fields the balancer names
in `require_acquire_fields` (here `prompt_ids`, so the placement sees the context); the
client then calls that server directly and releases it (`release_server`, with `request_id`
as `require_release_fields` asks). `clear_sticky_cache` comes at phase switches and
`get_total_inflight` is polled by the fully-async trainers until it reads zero. This class
satisfies that `RequestLoadBalancer` protocol, both ways verl builds a balancer:

* `actor_rollout_ref.rollout.router_config_path=/path/loom.yaml`, the YAML naming
  `router_class: loom.integrations.verl.LoomLoadBalancer` and Loom's settings (`placement`,
  `tp`, `model`, `gpu`, `idle_s`): verl builds `ray.remote(cls).remote(servers, config)`;
* `LLMServerManager(..., load_balancer_cls=LoomLoadBalancer)`: verl builds
  `cls(servers=..., max_cache_size=...)` with the default settings (Heddle's placement).

It brings Loom's placement, not its scheduling: verl talks to the servers itself, so PPS,
preemption and failover need the router in front of the engines (`loom serve rollout`).
verl does not say when a trajectory ends: one idle for `idle_s`, or all of them at
`clear_sticky_cache`, are finished.

Importing this module with a verl older than 0.9.1 (no `RequestLoadBalancer`) fails with a
message naming the verl it needs; without verl it imports (the protocol is structural).
"""

from __future__ import annotations

import importlib.util
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from loom.core.errors import ConfigError
from loom.rollout.policy import PlacementKind
from loom.runtime.rollout.config import RolloutServerConfig
from loom.runtime.rollout.driver import make_router, stable_id
from loom.runtime.rollout.state import Trajectory

__all__ = ["NO_SERVERS", "VERL_NEEDED", "LoomLoadBalancer"]

VERL_NEEDED = "verl >= 0.9.1 (verl.workers.rollout.router.RequestLoadBalancer)"
# NOTE: verl's fully-async client retries an acquire only on this very text
NO_SERVERS = "No available servers in load balancer"
_SETTINGS = {"router_class", "placement", "tp", "model", "gpu", "idle_s"}


def _check_verl() -> None:
    if importlib.util.find_spec("verl") is None:
        return
    try:
        from verl.workers.rollout.router import RequestLoadBalancer  # noqa: F401
    except ImportError as exc:
        import verl

        found = getattr(verl, "__version__", "unknown")
        raise ImportError(
            f"loom.integrations.verl needs {VERL_NEEDED}; found verl {found}"
        ) from exc


_check_verl()


@dataclass(eq=False)
class _Server:
    """A server as the placement reads it (`WorkerView`)."""

    idx: int
    id: str
    handle: Any
    tp: int
    node: int = 0
    load: int = 0
    trajectories: Mapping[int, Trajectory] = field(default_factory=dict)

    def cached_tokens(self, traj_id: int) -> int:
        t = self.trajectories.get(traj_id)
        return t.context if t is not None and t.host == self.idx else 0


class LoomLoadBalancer:
    """verl's `RequestLoadBalancer`, driving a Loom `Router` policy."""

    def __init__(
        self,
        servers: Mapping[str, Any] | None = None,
        yaml_config: Mapping[str, Any] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        **verl_kwargs: Any,
    ) -> None:
        # NOTE: verl's `load_balancer_cls` way passes max_cache_size (and its own balancer's
        # full_determinism); a Loom placement keeps no request cache, so they change nothing
        cfg = dict(yaml_config or {})
        unknown = set(cfg) - _SETTINGS
        if unknown:
            raise ConfigError(
                f"unknown loom router_config keys {sorted(unknown)}; known: {sorted(_SETTINGS)}"
            )
        try:
            settings = RolloutServerConfig(
                placement=PlacementKind(cfg.get("placement", "heddle")),
                model=cfg.get("model", "qwen3-14b"),
                gpu=cfg.get("gpu", "h100"),
            )
        except ValueError as exc:
            raise ConfigError(f"invalid loom router_config: {exc}") from None
        self._tp = {str(k): int(v) for k, v in (cfg.get("tp") or {}).items()}
        self.idle_s = float(cfg.get("idle_s", 600.0))
        self.router = make_router(settings)
        self.clock = clock
        self._idx = itertools.count()
        self._tids = itertools.count()
        self._servers: dict[str, _Server] = {}
        self._trajs: dict[str, Trajectory] = {}
        self._by_tid: dict[int, Trajectory] = {}
        self._inflight: dict[str, list[str]] = {}  # request id -> servers it holds
        self._prompt: dict[str, int] = {}  # request id -> its prompt's length at acquire
        self.add_servers(dict(servers or {}))

    # ---- verl's protocol -------------------------------------------------------------------

    def require_acquire_fields(self) -> list[str]:
        return ["prompt_ids"]

    def require_release_fields(self) -> list[str]:
        return ["request_id"]

    def acquire_server(
        self, request_id: str, prompt_ids: list[int] | None = None, **_extra: Any
    ) -> tuple[str, Any]:
        """The server for `request_id`'s next turn: the placement's choice."""
        if not self._servers:
            raise RuntimeError(NO_SERVERS)
        now = self.clock()
        self._expire(now)
        prompt = list(prompt_ids or ())
        views = self._views()
        t = self._trajs.get(request_id)
        if t is None:
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
        self._inflight.setdefault(request_id, []).append(server.id)
        self._prompt[request_id] = len(prompt)
        return server.id, server.handle

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        """A turn ended. verl sends this without waiting (fire and forget): unknown or
        repeated releases, and releases of removed servers, change nothing."""
        if request_id is not None:
            held = self._inflight.get(request_id)
            if held is None or server_id not in held:
                return
            held.remove(server_id)
            if not held:
                del self._inflight[request_id]
        server = self._servers.get(server_id)
        if server is not None and server.load > 0:
            server.load -= 1
        t = self._trajs.get(request_id) if request_id is not None else None
        if t is None:
            return
        t.steps_done += 1
        t.context = max(t.context, self._prompt.pop(request_id, 0)) if request_id else t.context
        t.last_seen_s = self.clock()
        self.router.migrate(t, self._views(), t.last_seen_s)  # its next turn: the new home
        for tid in self.router.stale():  # trajectories between turns move at once
            other = self._by_tid.get(tid)
            if other is not None and other.key not in self._inflight:
                self.router.migrate(other, self._views(), self.clock())

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
        for rid in list(self._inflight):  # their turns no longer count
            self._inflight[rid] = [s for s in self._inflight[rid] if s in self._servers]
            if not self._inflight[rid]:
                del self._inflight[rid]
        if self._servers:
            self.router.start([], self._views())

    def get_all_servers(self) -> list[str]:
        return list(self._servers)

    def get_total_inflight(self) -> int:
        return sum(s.load for s in self._servers.values())

    def get_status(self) -> dict[str, Any]:
        return {
            "servers": {s.id: s.load for s in self._servers.values()},
            "total_inflight": self.get_total_inflight(),
            "active_servers": len(self._servers),
            "registered_handles": list(self._servers),
            "placement": type(self.router).__name__,
            "trajectories": len(self._trajs),
        }

    def clear_sticky_cache(self) -> dict[str, Any]:
        """A phase switch: the trajectories between turns are finished (their placement
        forgets them); those with a turn in flight stay until it is released."""
        done = [key for key in self._trajs if key not in self._inflight]
        for key in done:
            self._end(key)
        return {
            "cleared_entries": len(done),
            "server_loads": {s.id: s.load for s in self._servers.values()},
        }

    # ---- internals -------------------------------------------------------------------------

    def _views(self) -> list[_Server]:
        return sorted(self._servers.values(), key=lambda s: (-s.tp, s.idx))

    def _end(self, key: str) -> None:
        t = self._trajs.pop(key)
        del self._by_tid[t.traj_id]
        self._prompt.pop(key, None)
        self.router.finish(t)

    def _expire(self, now: float) -> None:
        for key, t in list(self._trajs.items()):
            if key not in self._inflight and now - t.last_seen_s > self.idle_s:
                self._end(key)
