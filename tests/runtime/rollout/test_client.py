"""`loom.client.RolloutClient` against a real router and stand-in engines."""

from __future__ import annotations

import asyncio

import pytest

from conftest import Rig
from loom.client import RolloutClient
from loom.client.rollout import RolloutError


def test_a_trajectory_block_tags_every_turn_and_ends_the_trajectory(rig) -> None:
    r: Rig = rig(2)

    async def agent() -> tuple[dict, list[int]]:
        async with RolloutClient(r.router.url) as client:
            plan = await client.declare([{"id": "a", "prompt": "q"}, {"id": "b", "prompt": "q"}])
            lengths = []
            async with client.trajectory("a") as traj:
                context = [1, 2, 3]
                for _ in range(3):
                    out = await traj.generate(context, {"max_new_tokens": 4, "ignore_eos": True})
                    lengths.append(len(out["output_ids"]))
                    context += out["output_ids"] + [9]
                mid = await client.stats()
                assert mid["trajectories"]["active"] == 2
            await client.end("b")
            with pytest.raises(RolloutError) as err:
                await client.end("a")  # already ended by the block
            assert err.value.status == 404 and "unknown trajectory" in err.value.message
            return plan, lengths

    plan, lengths = asyncio.run(agent())
    assert set(plan) == {"a", "b"} and lengths == [4, 4, 4]
    stats = r.stats()
    assert stats["trajectories"]["active"] == 0 and stats["policy"]["turns"] == 3


def test_completion_through_the_client(rig) -> None:
    r: Rig = rig(1)

    async def go() -> dict:
        async with RolloutClient(r.router.url) as client:
            return await client.completion([5, 6], max_tokens=3, ignore_eos=True)

    out = asyncio.run(go())
    assert out["usage"]["completion_tokens"] == 3
