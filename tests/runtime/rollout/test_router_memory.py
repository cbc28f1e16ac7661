"""What a finished trajectory leaves in the router is bounded by a setting: the predictor's
history window (`history_limit`, its per-prompt means kept in step with it), and pending
predictions coalesce per trajectory however fast turns end. In-process engines, no sockets."""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
from typing import Any

from fake_engine import FakeEngine

from loom.runtime.rollout.config import EngineConfig, RolloutServerConfig
from loom.runtime.rollout.driver import RolloutDriver
from loom.runtime.rollout.turn import TurnRequest


async def _driver(**settings: Any) -> RolloutDriver:
    fakes: dict[str, FakeEngine] = {}
    cfg = RolloutServerConfig(placement="heddle", scheduler="pps", tokenizer="engine", **settings)
    d = RolloutDriver(cfg, client_factory=lambda k, u, s, t: fakes[u])
    await d.start()
    for i in range(2):
        url = f"http://fake{i}"
        fakes[url] = FakeEngine(url, None)
        await d.add_engine(EngineConfig(url=url, kind="sglang", max_running=64))
    return d


async def _trajectories(d: RolloutDriver, lo: int, hi: int, turns: int = 3) -> None:
    async def one(i: int) -> None:
        ctx = [1 + i, 2, 3]  # a prompt of its own: per-prompt means must not pile up
        for k in range(turns):
            req = TurnRequest({"max_tokens": 3, "ignore_eos": True}, client_rid=f"r{i}-{k}")
            [turn] = d.submit(f"t{i}", list(ctx), req)
            await turn.finished.wait()
            ctx += [*turn.generated, 100 + k]
        d.end_trajectory(f"t{i}")

    await asyncio.gather(*(one(i) for i in range(lo, hi)))


def test_a_finished_trajectory_leaves_a_bounded_record() -> None:
    async def go() -> tuple[int, int]:
        d = await _driver(history_limit=50, refit_every=10_000)
        d.predictor.due = lambda every: False  # type: ignore[method-assign]  # no model: no noise
        for lo in (0, 200):  # the window fills; the tables reach their size at 200 at once
            await _trajectories(d, lo, lo + 200)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for lo in (400, 600):
            await _trajectories(d, lo, lo + 200)
        await asyncio.sleep(0.2)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert len(d.predictor.history) == 50
        window = {s.prompt_id for s in d.predictor.history}
        assert set(d.predictor._prompt_sum) == window  # means of the window only
        assert not d.trajectories and not d.core.by_tid and not d.core.by_rid and not d.core.held
        assert d.counts["finished"] == 800
        await d.close()
        return grown, 400

    grown, n = asyncio.run(go())
    # a full window: what 400 more trajectories leave is noise, not 400 records (a record of
    # a 3-turn trajectory is about 1 kB, what the predictions had queued about 9 kB)
    assert grown < 1000 * n, f"{grown} bytes after {n} trajectories"


def test_pending_predictions_coalesce_per_trajectory() -> None:
    async def go() -> None:
        d = await _driver(history_limit=1000, refit_every=10_000)
        d.predictor.model = object()  # type: ignore[assignment]
        asked: list[int] = []

        def slow(specs: list[Any], generated: list[int]) -> list[float]:
            asked.append(len(specs))
            time.sleep(0.2)  # a model slower than the turns end
            return [g + 10.0 for g in generated]

        d.predictor.predict_many = slow  # type: ignore[method-assign]
        await _trajectories(d, 0, 40, turns=6)  # 240 turns end, 40 trajectories
        assert len(d.forecasts._asked) <= 40
        assert sum(asked) < 240  # asks of one trajectory coalesced
        await d.close()

    asyncio.run(go())
