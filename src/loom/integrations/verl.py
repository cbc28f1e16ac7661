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

verl's main branch (as of 2026-08-22) and its 0.9.0 have neither the protocol nor the YAML:
the class is passed in code, `LLMServerManager(..., load_balancer_cls=LoomLoadBalancer)`,
built as `cls(servers=..., max_cache_size=...)`; their client acquires with the request id
only (the placement sees no prompt) and releases with the server id only (the oldest turn on
that server ends).

verl's KV-cache-aware balancer work (pull request 7115, open) replaces the YAML's class name
with a registry: `verl.workers.rollout.router.base.LoadBalancerRegistry`, a balancer chosen by
`actor_rollout_ref.rollout.router_strategy=NAME` and built as `cls.remote(servers=...,
config=...)` from the `router_config` node (plus `full_determinism`); its client releases
with `release_server(server_id, prompt_len=...)`, no request id. Where the installed verl has
that registry, importing this module registers this class there as `loom` (`REGISTRY_NAME`),
and a release without a request id is matched to the oldest turn on that server with that
prompt length.

It brings Loom's placement, not its scheduling: verl talks to the servers itself, so PPS,
preemption and failover need the router in front of the engines (`loom serve rollout`).
verl does not say when a trajectory ends: one idle for `idle_s`, or all of them at
`clear_sticky_cache`, are finished.

Importing this module with a verl older than 0.9.0 (neither `RequestLoadBalancer` nor
`load_balancer_cls`) fails with a message naming the verl it needs; without verl it imports
(the protocol is structural).
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from loom.core.errors import ConfigError
from loom.rollout.policy import PlacementKind
from loom.runtime.rollout.config import RolloutServerConfig
from loom.runtime.rollout.policies import make_router, stable_id
from loom.runtime.rollout.state import Trajectory

__all__ = ["NO_SERVERS", "REGISTRY_NAME", "VERL_NEEDED", "LoomLoadBalancer", "register_with_verl"]

VERL_NEEDED = (
    "verl >= 0.9.0 (verl.workers.rollout.router.RequestLoadBalancer, or LLMServerManager's "
    "load_balancer_cls)"
)
# NOTE: verl's fully-async client retries an acquire only on this very text
NO_SERVERS = "No available servers in load balancer"
REGISTRY_NAME = "loom"  # `router_strategy=loom` where verl keeps a balancer registry
_SETTINGS = {"router_class", "placement", "tp", "model", "gpu", "idle_s"}
# what verl itself puts in the config: the default `router_config` node of its registry
# (its own balancer's cache size, meaningless to a placement) and `full_determinism`
_VERL_KEYS = {"max_cache_size", "full_determinism"}


def _check_verl() -> None:
    if importlib.util.find_spec("verl") is None:
        return
    try:
        from verl.workers.rollout.router import RequestLoadBalancer  # noqa: F401
    except ImportError as exc:
        if _takes_balancer_class():
            return  # verl's main (and 0.9.0): the class is passed in code, no protocol
        import verl

        found = getattr(verl, "__version__", "unknown")
        raise ImportError(
            f"loom.integrations.verl needs {VERL_NEEDED}; found verl {found}"
        ) from exc


def _takes_balancer_class() -> bool:
    """Whether verl's `LLMServerManager` takes `load_balancer_cls` (verl 0.9.0 on, its main
    branch included, where no `verl.workers.rollout.router` exists)."""
    try:
        from verl.workers.rollout.llm_server import LLMServerManager
    except ImportError:
        return False
    return "load_balancer_cls" in inspect.signature(LLMServerManager).parameters


_check_verl()


def _verl_registry() -> Any | None:
    """verl's balancer registry, where the installed verl has one (its KV-aware balancer
    work); None for verl 0.9.1, which names the class in a YAML instead."""
    if importlib.util.find_spec("verl") is None:
        return None
    try:
        from verl.workers.rollout.router.base import LoadBalancerRegistry
    except ImportError:
        return None
    return LoadBalancerRegistry


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
        config: Mapping[str, Any] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        **verl_kwargs: Any,
    ) -> None:
        """`config`: the YAML verl 0.9.1 loaded (positional), or the `router_config` node a
        registry passes (`config=`). NOTE: verl's `load_balancer_cls` way and a registry's
        default node pass max_cache_size, its own balancer's: a Loom placement keeps no
        request cache, so it changes nothing; `full_determinism` (a registry adds it from the
        rollout config) cannot be honoured and is refused when true."""
        cfg = dict(config or {})
        unknown = set(cfg) - _SETTINGS - _VERL_KEYS
        if unknown:
            raise ConfigError(
                f"unknown loom router_config keys {sorted(unknown)}; known: {sorted(_SETTINGS)}"
            )
        if cfg.get("full_determinism") or verl_kwargs.get("full_determinism"):
            raise ConfigError(
                "full_determinism is not supported: Loom's placement follows the servers' "
                "loads and the trajectories' predicted lengths, so a request's server "
                "depends on what else runs (use verl's default balancer for such runs)"
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
        # server -> the turns it holds, oldest first: (request id, prompt length at acquire)
        self._turns: dict[str, list[tuple[str, int]]] = {}
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
        self._turns.setdefault(server.id, []).append((request_id, len(prompt)))
        return server.id, server.handle

    def release_server(
        self, server_id: str, request_id: str | None = None, prompt_len: int | None = None
    ) -> None:
        """A turn ended. verl sends this without waiting (fire and forget): unknown or
        repeated releases, and releases of removed servers, change nothing. Without a
        `request_id` (verl's registry contract sends `prompt_len` instead) the turn is the
        oldest on that server acquired with that prompt length, else its oldest."""
        turns = self._turns.get(server_id, [])
        turn = _pick(turns, request_id, prompt_len)
        if turn is None:
            return
        turns.remove(turn)
        rid, length = turn
        held = self._inflight[rid]
        held.remove(server_id)
        if not held:
            del self._inflight[rid]
        server = self._servers[server_id]
        server.load -= 1
        t = self._trajs.get(rid)
        if t is None:
            return
        t.steps_done += 1
        t.context = max(t.context, length)
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
            self._turns.pop(sid, None)
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
        self.router.finish(t)

    def _expire(self, now: float) -> None:
        for key, t in list(self._trajs.items()):
            if key not in self._inflight and now - t.last_seen_s > self.idle_s:
                self._end(key)


def _pick(
    turns: list[tuple[str, int]], request_id: str | None, prompt_len: int | None
) -> tuple[str, int] | None:
    """The turn a release names: by request id; or, without one, the oldest with that
    prompt length, else the oldest."""
    if request_id is not None:
        return next((t for t in turns if t[0] == request_id), None)
    if prompt_len is not None:
        same = next((t for t in turns if t[1] == prompt_len), None)
        if same is not None:
            return same
    return turns[0] if turns else None


def register_with_verl() -> bool:
    """Register `LoomLoadBalancer` as `loom` in verl's balancer registry, where the
    installed verl has one; whether it is registered there."""
    registry = _verl_registry()
    if registry is None:
        return False
    if REGISTRY_NAME not in registry.list_strategies():
        registry.register(REGISTRY_NAME)(LoomLoadBalancer)
    return registry.get_cls(REGISTRY_NAME) is LoomLoadBalancer


register_with_verl()
