"""The balancer contract of verl's pull request 7115 (`verl/workers/rollout/router/base.py`
there), as its callers exercise it:

* a balancer class is registered by name (`LoadBalancerRegistry.register(name)`, a decorator
  that refuses a name taken) and chosen by `rollout.router_strategy` (default
  `global_sticky_inflight`);
* `get_router_handle(servers, rollout_config)` builds it as a Ray actor with keywords:
  `servers=` (address -> server actor) and `config=`, the `rollout.router_config` node as a
  plain dict (by default verl's own balancer's node, `{"max_cache_size": 10000}`) with
  `full_determinism` added from the rollout config;
* `LLMServerClient` calls `acquire_server(request_id=, prompt_ids=)` and, fire and forget,
  `release_server(server_id=, prompt_len=len(prompt_ids))`; the fully-async rollouter calls
  `add_servers(servers=)`, `remove_servers(server_ids=)`, `clear_sticky_cache()` and polls
  `get_total_inflight()` until it reads zero."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol, runtime_checkable

import ray

DEFAULT_STRATEGY = "global_sticky_inflight"


@runtime_checkable
class RequestLoadBalancer(Protocol):
    def __init__(self, servers: dict[str, Any], config: dict | None = None) -> None: ...

    def acquire_server(
        self, request_id: str, prompt_ids: list[int] | None = None
    ) -> tuple[str, Any]: ...

    def release_server(self, server_id: str, prompt_len: int = 0) -> None: ...

    def add_servers(self, servers: dict[str, Any]) -> None: ...

    def remove_servers(self, server_ids: list[str]) -> None: ...

    def get_all_servers(self) -> list[str]: ...

    def get_status(self) -> dict: ...


class LoadBalancerRegistry:
    _registry: ClassVar[dict[str, type]] = {}

    @classmethod
    def register(cls, name: str) -> Callable[[type], type]:
        def decorator(balancer_cls: type) -> type:
            if name in cls._registry:
                raise ValueError(f"Load balancer '{name}' is already registered")
            cls._registry[name] = balancer_cls
            return balancer_cls

        return decorator

    @classmethod
    def get_cls(cls, name: str) -> type:
        if name not in cls._registry:
            raise ValueError(f"Unknown load balancer strategy: '{name}'")
        return cls._registry[name]

    @classmethod
    def list_strategies(cls) -> list[str]:
        return sorted(cls._registry)


def get_router_handle(servers: dict[str, Any], rollout_config: Any) -> Any:
    cls = LoadBalancerRegistry.get_cls(rollout_config.get("router_strategy", DEFAULT_STRATEGY))
    config = dict(rollout_config.get("router_config", None) or {})
    config["full_determinism"] = getattr(rollout_config, "full_determinism", False)
    actor = cls if hasattr(cls, "remote") else ray.remote(cls)
    return actor.remote(servers=servers, config=config)
