"""Run by verl's environment (.venv-verl): build `LoomLoadBalancer` the two ways verl 0.9.1
does and drive it with verl's own client under a local Ray, then print what was seen as JSON
(tests/integrations/test_verl.py reads it). Usage: python verl_driver.py WORKDIR"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
import time
from pathlib import Path

import ray
from omegaconf import OmegaConf
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput
from verl.workers.rollout.router import RequestLoadBalancer, get_router_handle

from loom.integrations.verl import NO_SERVERS, LoomLoadBalancer, register_with_verl


@ray.remote(num_cpus=0)
class FakeServer:
    """A rollout server as verl's client calls it: token in, token out."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    async def generate(self, **kw: object) -> TokenOutput:
        self.calls += 1
        await asyncio.sleep(0.01)
        return TokenOutput(token_ids=[7, 8, 9], log_probs=[-0.1, -0.2, -0.3])

    def count(self) -> int:
        return self.calls


def protocol_mismatches() -> list[str]:
    """Methods of verl's protocol that LoomLoadBalancer lacks or names differently."""
    out = []
    for name, fn in inspect.getmembers(RequestLoadBalancer, inspect.isfunction):
        if name.startswith("_"):
            continue
        mine = getattr(LoomLoadBalancer, name, None)
        if mine is None:
            out.append(f"{name}: missing")
            continue
        theirs = [p for p in inspect.signature(fn).parameters if p not in ("self", "extra")]
        have = inspect.signature(mine).parameters
        out += [f"{name}: no parameter {p}" for p in theirs if p not in have]
    return out


async def drive(client: LLMServerClient, trajectories: int, turns: int) -> None:
    async def one(i: int) -> None:
        prompt = [i, 1, 2]
        for _ in range(turns):  # a multi-turn agent: the same request id, a longer prompt
            out = await client.generate(f"traj-{i}", prompt_ids=prompt, sampling_params={})
            prompt = prompt + list(out.token_ids) + [5]

    await asyncio.gather(*(one(i) for i in range(trajectories)))


def wait_zero(lb: object, timeout_s: float = 30.0) -> int:
    """verl's fully-async rebalance: poll get_total_inflight until it reads zero."""
    deadline = time.monotonic() + timeout_s
    while True:
        n = ray.get(lb.get_total_inflight.remote())  # type: ignore[attr-defined]
        if n == 0 or time.monotonic() > deadline:
            return int(n)
        time.sleep(0.2)


def main() -> None:
    work = Path(sys.argv[1])
    ray.init(num_cpus=2, object_store_memory=100_000_000, include_dashboard=False)
    report: dict[str, object] = {
        "mismatches": protocol_mismatches(),
        "registry": register_with_verl(),  # 0.9.1 has none: the YAML names the class
    }
    servers = {f"10.0.0.{i}:8000": FakeServer.remote(f"s{i}") for i in range(2)}
    yaml = work / "loom_router.yaml"
    yaml.write_text(
        "router_class: loom.integrations.verl.LoomLoadBalancer\nplacement: heddle\nidle_s: 600\n"
    )
    # way 1: actor_rollout_ref.rollout.router_config_path
    lb = get_router_handle(servers=servers, router_config_path=str(yaml))
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm"}}})
    client = LLMServerClient(config=cfg, load_balancer_handle=lb)
    asyncio.run(drive(client, trajectories=6, turns=3))
    report["inflight_after"] = wait_zero(lb)
    status = ray.get(lb.get_status.remote())
    report["status"] = status
    report["served"] = ray.get([s.count.remote() for s in servers.values()])
    cleared = ray.get(lb.clear_sticky_cache.remote())
    report["cleared"] = cleared
    report["after_clear"] = ray.get(lb.get_status.remote())["trajectories"]
    ray.get(lb.remove_servers.remote(server_ids=list(servers)))
    try:
        ray.get(lb.acquire_server.remote(request_id="late"))
        report["empty_pool"] = "no error"
    except Exception as exc:  # a RayTaskError around the balancer's RuntimeError
        report["empty_pool"] = NO_SERVERS if NO_SERVERS in str(exc) else str(exc)
    ray.get(lb.add_servers.remote(servers))
    report["readded"] = sorted(ray.get(lb.get_all_servers.remote()))
    # way 2: load_balancer_cls, built with keywords
    lb2 = get_router_handle(servers=servers, load_balancer_cls=LoomLoadBalancer)
    client2 = LLMServerClient(config=cfg, load_balancer_handle=lb2)
    asyncio.run(drive(client2, trajectories=3, turns=2))
    report["inflight_after_cls"] = wait_zero(lb2)
    report["status_cls"] = ray.get(lb2.get_status.remote())
    print("REPORT " + json.dumps(report), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
