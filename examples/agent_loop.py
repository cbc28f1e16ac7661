"""A verl-style multi-turn agent loop on Loom's runtime: every LLM turn goes through the
rollout router (`loom serve rollout`), every tool call runs in the action server
(`loom serve actions`).

For each sample: declare the batch to the router (Heddle plans it), then per turn ask the
model for the next step with the conversation so far (token ids, `X-Trajectory-Id` set by the
client), run the step's tool — here a small Python program in the trajectory's workspace — in
the action server, append its output, and go on until the turn budget is spent; leaving the
trajectory block ends it, so the router learns its length.

    # against running services (engines behind the router; an action server)
    python examples/agent_loop.py --router http://127.0.0.1:8800 --actions http://127.0.0.1:8700
    # self-contained: stand-in engines, a router and an action server in this process
    python examples/agent_loop.py --demo
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from loom.client import RolloutClient


async def run_tool(actions: httpx.AsyncClient, trajectory: str, code: str) -> str:
    """One tool call: a Python program in the trajectory's workspace, on one granted core."""
    body = {
        "trajectory_id": trajectory,
        "command": [sys.executable, "-c", code],
        "cpu": 1,
        "timeout_s": 30,
    }
    resp = await actions.post("/v1/actions", json=body)
    resp.raise_for_status()
    action = resp.json()["id"]
    while True:
        view = (await actions.get(f"/v1/actions/{action}", params={"wait_s": 30})).json()
        if view["status"] not in ("queued", "running"):
            return str(view.get("stdout") or view["status"])


def tool_tokens(text: str) -> list[int]:
    """The tool's reply as token ids (a stand-in for the tokenizer the trainer holds)."""
    return [3 + sum(map(ord, word)) % 400 for word in text.split()] or [3]


async def trajectory(
    llm: RolloutClient, actions: httpx.AsyncClient, key: str, prompt: list[int], turns: int
) -> dict[str, int]:
    context = list(prompt)
    generated = 0
    async with llm.trajectory(key) as traj:
        for step in range(turns):
            out = await traj.generate(context, {"max_new_tokens": 24, "temperature": 0})
            ids = out["output_ids"]
            generated += len(ids)
            context += ids
            if step == turns - 1:
                break
            # the model's step asks for a computation; the sandbox answers
            reply = await run_tool(actions, key, f"print(sum(range({len(context)})))")
            context += tool_tokens(reply)
    return {"turns": turns, "generated": generated, "context": len(context)}


async def agent_loop(router: str, actions_url: str, prompts: int, samples: int, turns: int) -> None:
    batch = [(f"p{p}-s{s}", p) for p in range(prompts) for s in range(samples)]
    async with (
        RolloutClient(router) as llm,
        httpx.AsyncClient(base_url=actions_url, timeout=120) as actions,
    ):
        plan = await llm.declare([{"id": key, "prompt_id": p} for key, p in batch])
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(trajectory(llm, actions, key, [1, 2, 3, p + 4], turns) for key, p in batch)
        )
        elapsed = time.perf_counter() - t0
        stats = await llm.stats()
    for (key, _), res in zip(batch, results, strict=True):
        print(f"{key}: engine {plan[key]}, {res['turns']} turns, {res['generated']} tokens")
    policy = stats["policy"]
    print(
        f"{len(batch)} trajectories in {elapsed:.1f} s; router: {policy['decisions']} decisions,"
        f" {policy['preemptions']} preemptions, {policy['migrations']} migrations"
    )


@contextlib.contextmanager
def demo_services() -> Iterator[tuple[str, str]]:
    """Two stand-in engines, a router in front of them and an action server, on loopback."""
    from loom.runtime.actions import ActionServerConfig, BackgroundServer
    from loom.runtime.rollout import BackgroundRouter, EngineConfig, RolloutServerConfig
    from loom.runtime.rollout.standin import StandinProcess

    with contextlib.ExitStack() as stack:
        engines = [stack.enter_context(StandinProcess()) for _ in range(2)]
        cfg = RolloutServerConfig(port=0, engines=tuple(EngineConfig(url=e.url) for e in engines))
        router = stack.enter_context(BackgroundRouter(cfg))
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        actions = stack.enter_context(BackgroundServer(ActionServerConfig(port=0, workdir=work)))
        yield router.url, actions.url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--router", default="http://127.0.0.1:8800")
    ap.add_argument("--actions", default="http://127.0.0.1:8700")
    ap.add_argument("--demo", action="store_true", help="start stand-in services here")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--turns", type=int, default=3)
    args = ap.parse_args()
    if args.demo:
        with demo_services() as (router, actions):
            asyncio.run(agent_loop(router, actions, args.prompts, args.samples, args.turns))
    else:
        asyncio.run(agent_loop(args.router, args.actions, args.prompts, args.samples, args.turns))


if __name__ == "__main__":
    main()
