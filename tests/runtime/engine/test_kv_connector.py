"""Loom's KV connector on real vLLM engines (the CPU build, the tiny model) sharing a store,
prefill chunked (vLLM's example connector crashed the loading engine so): a trajectory's KV
saved at one engine loads at another, whose answer is token for token and logprob for
logprob the one it gives having prefilled everything itself; blocks that are missing,
truncated or of another shape are recomputed and the engine serves on; new weights leave the
old blocks behind; and through the router, a trajectory that moves at every tool call finds
its context loaded where it moved."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from across import Across

from loom.runtime.engine import INSTALL_HINT, EnginePool, EngineProcess, engine_available
from loom.runtime.rollout import BackgroundRouter, RolloutServerConfig
from loom.runtime.rollout import EngineConfig as RouterEngine
from loom.runtime.rollout.driver import RolloutDriver

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.skipif(not engine_available(), reason=f"vLLM is not installed: {INSTALL_HINT}"),
]

CHUNK = 512  # prefill chunked well below the prompts here


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv-store")


@pytest.fixture(scope="module")
def engines(store: Path) -> Iterator[list[EngineProcess]]:
    with EnginePool(
        limit=2,
        kv_store=store,
        max_model_len=4096,
        priority=False,
        extra_args=("--max-num-batched-tokens", str(CHUNK)),
    ) as pool:
        yield pool.get(2)


def _complete(url: str, prompt: list[int], n: int, **extra: object) -> dict:
    body = {
        "model": "loom-tiny",
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "logprobs": 0,
        **extra,
    }
    resp = httpx.post(url + "/v1/completions", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _answer(out: dict) -> tuple[list[int], list[float]]:
    choice = out["choices"][0]
    return list(choice["token_ids"]), list(choice["logprobs"]["token_logprobs"])


def _same(a: tuple[list[int], list[float]], b: tuple[list[int], list[float]]) -> None:
    assert a[0] == b[0]
    assert a[1] == pytest.approx(b[1], abs=1e-5)


def _loaded(engine: EngineProcess) -> float:
    """Tokens the engine has loaded through its connector so far (vLLM's own counter)."""
    text = httpx.get(engine.url + "/metrics", timeout=30).text
    m = re.search(r"^vllm:external_prefix_cache_hits_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _block_size(engine: EngineProcess) -> int:
    info = httpx.get(engine.url + "/server_info?config_format=json", timeout=120).json()
    return int(info["vllm_config"]["cache_config"]["block_size"])


def _prompt(seed: int, n: int) -> list[int]:
    return [5 + (i * 7919 + seed * 104729) % 1000 for i in range(n)]


def _save(url: str, tokens: list[int]) -> int:
    out = _complete(url, tokens, 1, kv_transfer_params={"loom_save": True})
    return int(out["kv_transfer_params"]["loom_saved_tokens"])


def test_a_context_saved_at_one_engine_loads_at_another_with_prefill_chunked(
    engines: list[EngineProcess], store: Path
) -> None:
    a, b = engines
    bs = _block_size(a)
    ctx = _prompt(1, 2500)
    first = _answer(_complete(a.url, ctx, 8))
    ctx += first[0]
    saved = _save(a.url, ctx)  # a prefix hit at a: a step and the copy
    assert saved == len(ctx) // bs * bs
    nxt = [*ctx, 11, 12, 13]
    before = _loaded(b)
    moved = _answer(_complete(b.url, nxt, 16))
    assert _loaded(b) - before == saved  # b loaded every saved block, prefilled the rest
    # what b gives having prefilled everything itself (a context it never saw, saved nowhere)
    _same(moved, _answer(_complete(a.url, nxt, 16)))
    # a context never computed at the saving engine: it is prefilled there in chunks, and
    # each chunk's full blocks are saved as the chunk completes
    fresh = _prompt(2, 1800)
    assert _save(a.url, fresh) == len(fresh) // bs * bs
    before = _loaded(b)
    _same(_answer(_complete(b.url, [*fresh, 9], 8)), _answer(_complete(a.url, [*fresh, 9], 8)))
    assert _loaded(b) - before == len(fresh) // bs * bs


def test_blocks_it_cannot_load_are_recomputed_and_the_engine_serves_on(
    engines: list[EngineProcess], store: Path
) -> None:
    a, b = engines
    bs = _block_size(a)
    for seed, spoil in ((3, "truncate"), (4, "garbage"), (5, "remove")):
        ctx = _prompt(seed, 1400)
        saved_before = {p: p.stat().st_mtime for p in store.rglob("*.kv")}
        assert _save(a.url, ctx) == len(ctx) // bs * bs
        new = sorted(
            (p for p in store.rglob("*.kv") if p not in saved_before),
            key=lambda p: p.stat().st_mtime,
        )
        assert len(new) == len(ctx) // bs
        victim = new[len(new) // 2]
        if spoil == "truncate":
            victim.write_bytes(victim.read_bytes()[:100])
        elif spoil == "garbage":
            victim.write_bytes(b"\0" * victim.stat().st_size)
        else:
            victim.unlink()
        nxt = [*ctx, 7, 7]
        _same(_answer(_complete(b.url, nxt, 8)), _answer(_complete(a.url, nxt, 8)))
    assert b.alive and httpx.get(b.url + "/health", timeout=10).status_code == 200
    assert "not loaded" in b.log_tail(400)  # it said which block, and recomputed it


def test_new_weights_leave_the_old_blocks_behind(engines: list[EngineProcess]) -> None:
    """A prefix-cache reset with `reset_external` (what a weight sync sends) moves an engine
    to a new generation of the store: blocks saved before are not loaded after."""
    a, b = engines
    ctx = _prompt(6, 1300)
    assert _save(a.url, ctx) > 0
    for e in (a, b):
        r = httpx.post(e.url + "/reset_prefix_cache", params={"reset_external": "true"}, timeout=60)
        assert r.status_code == 200, r.text
    before = _loaded(b)
    _complete(b.url, [*ctx, 1], 4)
    assert _loaded(b) == before
    # and what is saved after the reset moves as before
    other = _prompt(7, 1300)
    assert _save(a.url, other) > 0
    _complete(b.url, [*other, 2], 4)
    assert _loaded(b) > before


@contextlib.contextmanager
def _router(engines: list[EngineProcess], move_kv: bool) -> Iterator[httpx.Client]:
    cfg = RolloutServerConfig(
        port=0,
        engines=tuple(RouterEngine(url=e.url, max_running=8) for e in engines),
        placement="least_load",
        scheduler="fcfs",
        move_kv=move_kv,
    )
    with (
        BackgroundRouter(cfg, RolloutDriver(cfg, router=Across())) as r,
        httpx.Client(base_url=r.url, timeout=300) as http,
    ):
        yield http


@pytest.mark.parametrize("move_kv", [True, False])
def test_a_trajectory_moved_by_the_router_loads_its_context_where_it_moved(
    engines: list[EngineProcess], move_kv: bool
) -> None:
    """Every tool call moves the trajectory to the other engine. With KV moves, the router
    saves its context at the engine it leaves (a turn of one token) and the next turn loads
    it where it moved; its tokens and logprobs are those of a run that never moved. Without,
    the other engine prefills everything again."""
    ctx = _prompt(10 + move_kv, 1500)
    bs = _block_size(engines[0])
    saved = []  # each turn's context at its end: what a move saves
    loaded = [_loaded(e) for e in engines]
    with _router(engines, move_kv) as http:
        engine_kv = {k: e["kv"] for k, e in http.get("/v1/stats").json()["engines"].items()}
        for step in range(3):
            body = {
                "prompt": ctx,
                "max_tokens": 24,
                "ignore_eos": True,
                "temperature": 0,
                "return_token_ids": True,
                "logprobs": 0,
            }
            resp = http.post("/v1/completions", json=body, headers={"X-Trajectory-Id": "mv"})
            assert resp.status_code == 200, resp.text
            got = _answer(resp.json())
            _same(got, _answer(_complete(engines[step % 2].url, ctx, 24)))
            ctx += got[0]
            saved.append(len(ctx))
            ctx += [9 + step] * 150  # the tool's reply (more than a block)
            time.sleep(0.5)  # the tool call: the save runs meanwhile
        counts = http.get("/v1/stats").json()["policy"]
        http.post("/v1/trajectories/mv/end")
    gained = sum(_loaded(e) - x for e, x in zip(engines, loaded, strict=True))
    if move_kv:
        assert all(engine_kv.values()), engine_kv  # the router saw the connector
        assert counts["kv_copies"] == 3 and counts["kv_copies_failed"] == 0
        assert counts["migrations"] >= 2
        # the second turn loaded the first's context; the third, back where the first ran,
        # the blocks the second added (the first's it holds itself)
        assert gained == saved[1] // bs * bs
    else:
        assert counts["kv_copies"] == 0 and counts["migrations"] >= 2
        assert gained == 0
