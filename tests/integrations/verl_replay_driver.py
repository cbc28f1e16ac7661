"""Run with `verl_replay/MODE/` first on PYTHONPATH (tests/integrations/test_verl.py): build
`LoomLoadBalancer` the way that verl does and drive it as that verl's clients do, under a
local Ray; print what was seen as one `REPORT {json}` line.

MODE `registry`: verl's KV-aware balancer work (a registry, `router_strategy=loom`,
`__init__(servers=, config=)`, releases by prompt length). MODE `main`: verl's main branch
(`LLMServerManager(load_balancer_cls=)`, acquires without a prompt, releases by server only).
Usage: python verl_replay_driver.py MODE"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import ray

from loom.integrations.verl import NO_SERVERS, REGISTRY_NAME, LoomLoadBalancer, register_with_verl


class RolloutConfig:
    """What the registry's `get_router_handle` reads of verl's rollout config (a DictConfig
    there)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def get(self, key: str, default: Any = None) -> Any:
        return self.__dict__.get(key, default)


@ray.remote(num_cpus=0)
class FakeServer:
    def __init__(self) -> None:
        self.calls = 0

    async def generate(self, **kw: object) -> list[int]:
        self.calls += 1
        await asyncio.sleep(0.01)
        return [7, 8, 9]

    def count(self) -> int:
        return self.calls


def protocol_mismatches(protocol: type) -> list[str]:
    """Methods of verl's protocol that LoomLoadBalancer lacks or names differently."""
    import inspect

    out = []
    for name, fn in inspect.getmembers(protocol, inspect.isfunction):
        if name.startswith("_") and name != "__init__":
            continue
        mine = getattr(LoomLoadBalancer, name, None)
        if mine is None:
            out.append(f"{name}: missing")
            continue
        theirs = [p for p in inspect.signature(fn).parameters if p != "self"]
        have = inspect.signature(mine).parameters
        out += [f"{name}: no parameter {p}" for p in theirs if p not in have]
    return out


async def drive_registry(lb: Any, trajectories: int, turns: int) -> None:
    """The registry's `LLMServerClient.generate`: acquire with the prompt, call the server,
    release with the prompt's length and no request id, without waiting."""

    async def one(i: int) -> None:
        prompt = [i, 1, 2]
        for _ in range(turns):
            sid, handle = await lb.acquire_server.remote(request_id=f"traj-{i}", prompt_ids=prompt)
            try:
                out = await handle.generate.remote(prompt_ids=prompt)
            finally:
                lb.release_server.remote(server_id=sid, prompt_len=len(prompt))
            prompt = prompt + list(out) + [5]

    await asyncio.gather(*(one(i) for i in range(trajectories)))


async def drive_main(lb: Any, trajectories: int, turns: int) -> None:
    """main's own `LLMServerClient` (the stand-in's): no prompt, release by server only."""
    from verl.workers.rollout.llm_server import LLMServerClient

    client = LLMServerClient(load_balancer_handle=lb)

    async def one(i: int) -> None:
        prompt = [i, 1, 2]
        for _ in range(turns):
            out = await client.generate(f"traj-{i}", prompt_ids=prompt)
            prompt = prompt + list(out) + [5]

    await asyncio.gather(*(one(i) for i in range(trajectories)))


def wait_zero(lb: Any, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        n = ray.get(lb.get_total_inflight.remote())
        if n == 0 or time.monotonic() > deadline:
            return int(n)
        time.sleep(0.2)


def build(mode: str, servers: dict[str, Any], **router_config: Any) -> Any:
    if mode == "registry":
        from verl.workers.rollout.router import get_router_handle

        cfg = RolloutConfig(router_strategy=REGISTRY_NAME, router_config=router_config)
        return get_router_handle(servers, cfg)
    from verl.workers.rollout.llm_server import LLMServerManager

    manager = LLMServerManager(load_balancer_cls=LoomLoadBalancer, servers=servers)
    return manager.global_load_balancer


def main() -> None:
    mode = sys.argv[1]
    ray.init(num_cpus=2, object_store_memory=100_000_000, include_dashboard=False)
    report: dict[str, Any] = {"registered": register_with_verl()}
    if mode == "registry":
        from verl.workers.rollout.router import LoadBalancerRegistry, RequestLoadBalancer

        report["mismatches"] = protocol_mismatches(RequestLoadBalancer)
        report["strategies"] = LoadBalancerRegistry.list_strategies()
    drive = drive_registry if mode == "registry" else drive_main
    servers = {f"10.0.0.{i}:8000": FakeServer.remote() for i in range(2)}
    lb = build(mode, servers, placement="heddle", idle_s=600)
    asyncio.run(drive(lb, trajectories=6, turns=3))
    report["inflight_after"] = wait_zero(lb)
    report["status"] = ray.get(lb.get_status.remote())
    report["served"] = ray.get([s.count.remote() for s in servers.values()])
    report["cleared"] = ray.get(lb.clear_sticky_cache.remote())
    ray.get(lb.remove_servers.remote(server_ids=list(servers)))
    try:
        ray.get(lb.acquire_server.remote(request_id="late"))
        report["empty_pool"] = "no error"
    except Exception as exc:  # a RayTaskError around the balancer's RuntimeError
        report["empty_pool"] = NO_SERVERS if NO_SERVERS in str(exc) else str(exc)
    ray.get(lb.add_servers.remote(servers=servers))
    report["readded"] = sorted(ray.get(lb.get_all_servers.remote()))
    if mode == "registry":
        # router_strategy=loom alone: verl's default node (its own balancer's cache size)
        plain = build(mode, servers, max_cache_size=10000)
        asyncio.run(drive(plain, trajectories=3, turns=2))
        report["inflight_after_default_node"] = wait_zero(plain)
        report["status_default_node"] = ray.get(plain.get_status.remote())
        # rollout.full_determinism cannot be honoured: refused by name
        from verl.workers.rollout.router import get_router_handle

        strict = get_router_handle(
            servers, RolloutConfig(router_strategy=REGISTRY_NAME, full_determinism=True)
        )
        try:
            ray.get(strict.get_all_servers.remote())
            report["full_determinism"] = "accepted"
        except Exception as exc:
            report["full_determinism"] = str(exc)[-300:]
    print("REPORT " + json.dumps(report), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
