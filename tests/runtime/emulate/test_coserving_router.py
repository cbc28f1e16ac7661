"""Loom's router running ROSE's placement over a dedicated emulated engine and a lent
co-serving one (`--coserve`): the lent engine's side (its room and serving slack) reaches the
router by itself; a serving burst on the lent engine takes pages back from the rollout turns
running there, and the router moves each of them elsewhere with what it generated, so that
every turn still ends with the whole output an uninterrupted run gives; `/v1/stats` shows
each pool's load."""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from loom.runtime.emulate import EmulatedProcess
from loom.runtime.emulate.tokens import generate
from loom.runtime.rollout import BackgroundRouter, EngineConfig, RolloutServerConfig

SPEC = "qwen3-8b@h800"
SERVING = "qwen2.5-7b"
SCALE = "0.05"
N = 6000  # rollout tokens a turn: it runs seconds of wall time, through the burst


def test_a_serving_burst_reclaims_lent_pages_and_the_router_moves_the_turns() -> None:
    with contextlib.ExitStack() as stack:
        dedicated = stack.enter_context(EmulatedProcess(SPEC, "--time-scale", SCALE))
        lent = stack.enter_context(
            EmulatedProcess(SPEC, "--time-scale", SCALE, "--coserve", SERVING, "--role", "decode")
        )
        cfg = RolloutServerConfig(
            port=0,
            engines=(
                EngineConfig(url=dedicated.url, id="d0"),
                EngineConfig(url=lent.url, id="l0", lent=True),
            ),
            placement="rose",
            rose_cap_per_gpu=4,
            load_interval_s=0.2,
        )
        router = stack.enter_context(BackgroundRouter(cfg))
        http = stack.enter_context(httpx.Client(base_url=router.url, timeout=300))
        side = stack.enter_context(httpx.Client(base_url=lent.url, timeout=300))
        deadline = time.monotonic() + 30
        while http.get("/v1/stats").json()["engines"]["l0"]["free_tokens"] is None:
            assert time.monotonic() < deadline, "the lent engine's side never reached the router"
            time.sleep(0.1)
        prompts = [[11 + i] * 30_000 for i in range(8)]

        def rollout(i: int) -> dict:
            body = {"prompt": prompts[i], "max_tokens": N, "ignore_eos": True}
            headers = {"X-Trajectory-Id": f"t{i}"}
            resp = http.post(
                "/v1/completions", json={**body, "return_token_ids": True}, headers=headers
            )
            assert resp.status_code == 200, resp.text
            return resp.json()["choices"][0]

        def serving(i: int) -> int:
            # long decodes, so that the burst's requests hold their pages at once however
            # slowly a loaded machine sends them: more than the rollout leaves free
            body = {"model": SERVING, "prompt": [3] * 4000, "max_tokens": 2000}
            return side.post("/v1/completions", json=body).status_code

        with ThreadPoolExecutor(8) as turns, ThreadPoolExecutor(96) as burst:
            futures = [turns.submit(rollout, i) for i in range(8)]
            while http.get("/v1/stats").json()["pools"]["lent"]["running"] < 4:
                assert time.monotonic() < deadline + 60, "the lent engine never took turns"
                time.sleep(0.05)
            pools = http.get("/v1/stats").json()["pools"]
            assert pools["dedicated"]["running"] == 4 and pools["lent"]["running"] == 4
            served = list(burst.map(serving, range(192)))
            outs = [f.result(300) for f in futures]
        assert served == [200] * 192
        for i, out in enumerate(outs):  # whole, as if never moved
            assert out["finish_reason"] == "length"
            assert out["token_ids"] == generate(prompts[i], N, ignore_eos=True).tokens
        stats = http.get("/v1/stats").json()
        coserve = side.get("/loom/coserve").json()
        # every turn the engine took off its GPU (for serving, or stalled 2 s there) moved
        assert coserve["reclaimed"] >= 1
        assert stats["policy"]["reclaimed"] == coserve["reclaimed"] + coserve["stalled"]
        assert stats["policy"]["aborted"] == 0  # no client heard an abort
        assert set(stats["pools"]) == {"dedicated", "lent"}
        assert stats["pools"]["lent"]["engines"] == stats["pools"]["dedicated"]["engines"] == 1
