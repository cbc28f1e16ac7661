"""verl main's `verl/workers/rollout/llm_server.py`, as far as a balancer meets it:

* `LLMServerManager(..., load_balancer_cls=cls)` builds the balancer as a Ray actor with
  keywords, `servers=` (address -> server actor) and `max_cache_size=` (its own balancer's
  sticky cache; `full_determinism=` only for that balancer itself);
* `LLMServerClient.generate` calls `acquire_server(request_id=)`, no prompt, then the server,
  then, fire and forget, `release_server(server_id=)`, no request id;
* the fully-async rollouter and the separate-async trainer call `add_servers(servers=)`,
  `remove_servers(server_ids=)`, `clear_sticky_cache()` and poll `get_total_inflight()`."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import ray

DEFAULT_ROUTING_CACHE_SIZE = 10000


class LLMServerManager:
    def __init__(
        self,
        config: Any = None,
        worker_group: Any = None,
        rollout_resource_pool: Any = None,
        start_rank: int = 0,
        load_balancer_cls: type | None = None,
        *,
        servers: dict[str, Any] | None = None,
    ) -> None:
        assert load_balancer_cls is not None, "the replay builds only a given balancer"
        self.global_load_balancer = ray.remote(load_balancer_cls).remote(
            servers=dict(servers or {}), max_cache_size=DEFAULT_ROUTING_CACHE_SIZE
        )


class LLMServerClient:
    def __init__(self, config: Any = None, load_balancer_handle: Any = None) -> None:
        self._load_balancer = load_balancer_handle

    async def generate(self, request_id: str, *, prompt_ids: list[int], **kw: Any) -> Any:
        sid, server = await self._load_balancer.acquire_server.remote(request_id=request_id)
        try:
            return await server.generate.remote(request_id=uuid4().hex, prompt_ids=prompt_ids)
        finally:
            self._load_balancer.release_server.remote(server_id=sid)
