"""Admission where the engine schedules: a turn goes to its engine at once while the engine
says it has room, waits in the router only when the engine would queue it, and then goes to
whichever engine frees first; preemptions pay for their prefill again and are capped; no turn
waits without bound. Stand-in engines in their own processes (room, queue, late binding,
the prefill gate) and fake engines in the test's process (a stream of trajectories)."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest
from fake_engine import FakeEngine

from conftest import Rig
from loom.rollout.moves import slot_wait_s
from loom.runtime.rollout import EngineConfig, RolloutServerConfig
from loom.runtime.rollout.admission import Capacity, engine_priority
from loom.runtime.rollout.driver import RolloutDriver
from loom.runtime.rollout.engines import EngineClient, EngineLoad, sglang_load, vllm_load
from loom.runtime.rollout.standin import write_standin_profile
from loom.runtime.rollout.state import Trajectory, Turn
from loom.runtime.rollout.turn import TurnRequest


def _stream(r: Rig, key: str, prompt: list[int], n: int, seen: threading.Event) -> None:
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": n, "ignore_eos": True},
        "stream": True,
    }
    with r.http.stream("POST", "/generate", json=body, headers={"X-Trajectory-Id": key}) as s:
        for line in s.iter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            if len(json.loads(line[5:])["output_ids"]) >= 3:
                seen.set()


def _until(r: Rig, what: Any, deadline_s: float = 30.0) -> dict[str, Any]:
    """Poll the router's stats until `what(stats)` holds."""
    import time

    end = time.monotonic() + deadline_s
    while True:
        stats = r.stats()
        if what(stats):
            return stats
        assert time.monotonic() < end, f"not reached in {deadline_s} s: {stats}"
        time.sleep(0.02)


def _background(r: Rig, key: str, prompt: list[int], n: int) -> tuple[threading.Thread, Any]:
    seen = threading.Event()
    t = threading.Thread(target=_stream, args=(r, key, prompt, n, seen))
    t.start()
    return t, seen


# ---- what engines say of their load --------------------------------------------------------


def test_load_reports_are_parsed_from_vllm_metrics_and_sglang_routes() -> None:
    text = b"""# HELP vllm:num_requests_running running
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_running{engine="0",model_name="other"} 9.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{model_name="m"} 100.0
"""
    assert vllm_load(text, "m") == EngineLoad(running=5, waiting=1, kv_usage=0.75)
    with pytest.raises(Exception, match="num_requests_running"):
        vllm_load(b"other_metric 1\n", "m")
    new = {
        "loads": [
            {
                "num_running_reqs": 2,
                "num_waiting_reqs": 1,
                "token_usage": 0.3,
                "max_running_requests": 8,
            },
            {
                "num_running_reqs": 1,
                "num_waiting_reqs": 0,
                "token_usage": 0.9,
                "max_running_requests": 8,
            },
        ]
    }
    assert sglang_load(new) == EngineLoad(running=3, waiting=1, kv_usage=0.9, max_running=16)
    old = [{"num_reqs": 5, "num_waiting_reqs": 2, "num_tokens": 10}]
    assert sglang_load(old) == EngineLoad(running=3, waiting=2)
    for bad in ({"loads": []}, {"loads": [{"num_running_reqs": 1}]}, "x"):
        with pytest.raises(Exception, match="SGLang load"):
            sglang_load(bad)


def test_capacity_follows_what_the_engine_says() -> None:
    c = Capacity(configured=None, stated=None)
    assert c.limit == float("inf")  # nothing said: forward at once
    c.observe(EngineLoad(running=4, waiting=2), ours=6)
    assert c.limit == 4  # it queued two of our six: it runs four
    c.observe(EngineLoad(running=4, waiting=0, kv_usage=0.99), ours=4)
    assert c.limit == 4  # full KV: stay
    c.observe(EngineLoad(running=4, waiting=0, kv_usage=0.5), ours=4)
    assert c.limit == 5  # room and all of it used: grow
    c.observe(EngineLoad(running=3, waiting=0, max_running=6), ours=3)
    assert c.limit == 5 and c.stated == 6
    c.observe(EngineLoad(running=5, waiting=0), ours=5)
    assert c.limit == 6  # up to what it states
    assert Capacity(configured=2, stated=8).limit == 2


def test_engine_priority_keeps_the_order_in_either_convention() -> None:
    keys = [(-1, 1, 5.0), (0, 0, 100.0), (0, 1, -1e12 - 3), (0, 1, -2.5), (0, 1, 7.0), (1, 0, 0)]
    low = [engine_priority(k, high_first=False) for k in keys]
    assert low == sorted(low) and len(set(low)) == len(low)
    high = [engine_priority(k, high_first=True) for k in keys]
    assert high == sorted(high, reverse=True)
    assert all(-(2**63) <= p < 2**63 for p in low)


def test_slot_wait() -> None:
    assert slot_wait_s(4, None) == float("inf")
    assert slot_wait_s(4, 2.0) == 0.5 and slot_wait_s(4, 2.0, ahead=3) == 2.0


# ---- room, queue and late binding over stand-in engines ------------------------------------


def test_a_turn_goes_at_once_while_the_engine_says_it_has_room_and_waits_when_it_would_queue(
    rig,
) -> None:
    """The stand-in runs two at once (it says so); the router has no cap of its own."""
    r: Rig = rig(1, step_ms=5, max_running=None, engine_running=2, scheduler="fcfs")
    threads = [_background(r, f"a{i}", [1, 2, i + 3], 400) for i in range(2)]
    for _, seen in threads:
        assert seen.wait(30)
    assert len(r.engines[0].get("/debug/requests")) == 2  # both forwarded at once
    third = _background(r, "a2", [7, 7], 5)
    stats = _until(r, lambda s: s["engines"]["e0"]["waiting"] == 1)
    assert stats["engines"]["e0"]["limit"] == 2
    assert len(r.engines[0].get("/debug/requests")) == 2  # held: the engine would queue it
    assert r.engines[0].get("/debug/stats")["max_seen"] <= 2
    r.http.post("/abort_request", json={"abort_all": True})
    for t, _ in [*threads, third]:
        t.join(60)
    for i in range(3):
        r.http.post(f"/v1/trajectories/a{i}/end")


def test_the_router_learns_the_room_from_a_queue_the_engine_reports(rig) -> None:
    """An engine that states no useful limit but queues (its KV holds two contexts): the
    router forwards, sees the queue in the load report, and holds the next turns."""
    r: Rig = rig(
        1,
        step_ms=5,
        max_running=None,
        engine_args=("--kv-tokens", "1000"),
        scheduler="fcfs",
        load_interval_s=0.05,
    )
    prompt = list(range(3, 403))  # 400 tokens: two fit in 1000
    threads = [_background(r, f"q{i}", [*prompt, i], 300) for i in range(3)]
    assert r.stats()["engines"]["e0"]["limit"] == 64  # what it states
    _until(r, lambda s: s["engines"]["e0"]["limit"] == 2)  # what its queue shows
    more = [_background(r, f"q{i}", [*prompt, i], 5) for i in range(3, 5)]
    _until(r, lambda s: s["engines"]["e0"]["waiting"] == 2)
    assert len(r.engines[0].get("/debug/requests")) == 3  # the two after are held
    r.http.post("/abort_request", json={"abort_all": True})
    for t, _ in threads + more:
        t.join(60)
    for i in range(5):
        r.http.post(f"/v1/trajectories/q{i}/end")


def test_a_waiting_turn_goes_to_whichever_engine_frees_first(rig) -> None:
    r: Rig = rig(2, step_ms=5, max_running=1, placement="least_load", scheduler="fcfs")
    # the short turn runs two seconds after the late one is sent (a loaded machine must not let
    # it finish first, or the late turn finds a free engine and never waits); the long one
    # runs until the test aborts it
    long, seen_long = _background(r, "long", [1, 1], 4000)
    assert seen_long.wait(30)
    short, seen_short = _background(r, "short", [2, 2], 400)
    assert seen_short.wait(30)
    engine_of = {
        q["input_ids"][0]: i for i, e in enumerate(r.engines) for q in e.get("/debug/requests")
    }
    # both engines busy: the next turn waits in the router (each engine runs one)
    late = _background(r, "late", [3, 3], 5)
    late[0].join(60)  # it ran on the engine that freed first, the short turn's
    assert r.stats()["timing"]["longest_wait_s"] > 0.1, r.stats()  # and it waited for it
    where = [
        i
        for i, e in enumerate(r.engines)
        for q in e.get("/debug/requests")
        if q["input_ids"] == [3, 3]
    ]
    assert where == [engine_of[2]] and engine_of[2] != engine_of[1]
    stats = r.stats()
    assert stats["reprefill_tokens"]["late_binding"] == 0  # nothing computed before
    r.http.post("/abort_request", json={"abort_all": True})
    for t in (long, short):
        t.join(60)
    for key in ("long", "short", "late"):
        r.http.post(f"/v1/trajectories/{key}/end")


def test_the_routers_abort_all_ends_turns_running_and_waiting_in_the_router(rig) -> None:
    """`abort_all` at the router (its own `GET /workers` entry, which slime's abort loop
    aborts with the engines) over an admitting router: four turns run (each engine says it
    runs two at once), two wait in the router. Every turn ends abort with what it generated,
    the waiting ones never reach an engine (ending the running ones frees slots: the waiting
    turns must not be started there only to be aborted), and nothing runs on the engines
    afterwards."""
    r: Rig = rig(2, step_ms=10, max_running=None, engine_running=2, placement="least_load")
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(r.gen, None, 3000, [3, 4, i]) for i in range(6)]
        _until(
            r,
            lambda s: (
                all(e["running"] == 2 for e in s["engines"].values())
                and sum(e["waiting"] for e in s["engines"].values()) + s["held"] == 2
                and all(e["tokens"] > 0 for e in s["engines"].values())
            ),
        )
        router = r.http.get("/workers").json()["workers"][0]["url"]
        aborted = []
        for _ in range(20):  # slime's abort_servers_until_idle, for the router's own url
            aborted.append(
                r.http.post(router + "/abort_request", json={"abort_all": True}).json()["aborted"]
            )
            load = r.http.get(router + "/v1/loads", params={"include": "core"}).json()
            if sum(x["num_total_reqs"] for x in load["loads"]) == 0:
                break
    outs = [f.result(60).json() for f in futures]
    assert aborted[0] == 6 and sum(aborted) == 6
    assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for o in outs)
    assert all(len(o["output_ids"]) < 3000 for o in outs)
    sent = [q["input_ids"][2] for e in r.engines for q in e.get("/debug/requests")]
    assert len(sent) == 4 == len(set(sent))  # the waiting turns were never sent to be aborted
    assert all(outs[i]["output_ids"] == [] for i in range(6) if i not in sent)
    assert sum(e["admitted"] for e in r.stats()["engines"].values()) == 4
    _until(r, lambda _: all(e.get("/debug/stats")["running"] == 0 for e in r.engines))


def test_an_engine_queue_sends_that_many_turns_beyond_its_limit(rig) -> None:
    """`queue=1`: with two running at the engine, one more waits in the engine's own queue
    (a freed slot refills without a round trip through the router); the rest wait in the
    router, and each finished turn lets exactly one more through."""
    r: Rig = rig(1, step_ms=10, max_running=2, engine_running=2, engine_queue=1)
    with ThreadPoolExecutor(5) as pool:
        futures = [pool.submit(r.gen, None, 3000, [3, 4, i]) for i in range(5)]
        _until(
            r,
            lambda s: (
                (e := next(iter(s["engines"].values())))["running"] == 3
                and e["waiting"] + s["held"] == 2
            ),
        )
        assert len(r.engines[0].get("/debug/requests")) == 3
        for url in [w["url"] for w in r.http.get("/workers").json()["workers"]]:
            r.http.post(url + "/abort_request", json={"abort_all": True})
        outs = [f.result(60).json() for f in futures]
    assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for o in outs)
    assert sum(e["admitted"] for e in r.stats()["engines"].values()) == 3


# ---- the prefill gate ----------------------------------------------------------------------


def test_a_preemption_that_does_not_pay_for_its_prefill_again_does_not_happen(
    rig, tmp_path
) -> None:
    """The stand-in's profile prices a prompt token at 2 ms: preempting a turn of 600
    tokens would cost 1.2 s of prefill to save a wait of a few short turns' time."""
    profile = tmp_path / "standin.csv"
    write_standin_profile(profile, 0.004, prefill_s_per_token=2e-3)
    r: Rig = rig(
        1,
        step_ms=4,
        max_running=1,
        placement="least_load",
        scheduler="pps",
        profiles=(profile,),
    )
    assert r.gen("warm", 3).status_code == 200  # the engine's pace: short turns
    r.http.post("/v1/trajectories/warm/end")
    prompt = list(range(3, 603))
    first = r.gen("long", 2, prompt=prompt).json()["output_ids"]
    t, seen = _background(r, "long", [*prompt, *first, 50], 400)  # 1.6 s: it still runs when
    assert seen.wait(30)  # a loaded machine sends the fresh turn
    # a trajectory on its first step outranks one past it under PPS, but does not pay
    assert r.gen("fresh", 10, prompt=[9, 9]).status_code == 200
    t.join(60)
    stats = r.stats()
    assert stats["policy"]["preemptions"] == 0
    assert stats["policy"]["preemptions_declined"] >= 1
    assert stats["reprefill_tokens"]["preemption"] == 0
    for key in ("long", "fresh"):
        r.http.post(f"/v1/trajectories/{key}/end")


# ---- no turn starves: a stream of fresh trajectories over in-process engines ---------------


class _Newest:
    """A preemptive scheduler that always prefers the newest turn (LIFO): without bounds,
    an old turn starves and running turns are preempted again and again."""

    preemptive = True
    priority_eviction = False

    def key(self, t: Any, now: float) -> float:
        return -t.turn_arrival_s

    def outranks(self, waiting: float, running: float) -> bool:
        return waiting < running


async def _stream_of_trajectories(max_wait_s: float, max_preemptions: int) -> dict[str, Any]:
    fake = FakeEngine("http://fake0", None)

    def client(kind: Any, url: str, session: Any, timeout: float) -> EngineClient:
        return fake

    cfg = RolloutServerConfig(
        engines=(EngineConfig(url=fake.url, kind="sglang", max_running=1),),
        placement="least_load",
        max_wait_s=max_wait_s,
        max_preemptions=max_preemptions,
        tokenizer="engine",
    )
    driver = RolloutDriver(cfg, scheduler=_Newest(), client_factory=client)
    await driver.start()
    try:

        def submit(key: str, n: int) -> Turn:
            req = TurnRequest({"max_tokens": n, "ignore_eos": True})
            return driver.submit(key, [5, 6, 7], req)[0]

        old = submit("old", 20)
        turns = [old]
        for i in range(150):  # a fresh 20-token turn every 5 ms: faster than one engine runs
            turns.append(submit(f"f{i}", 20))
            await asyncio.sleep(0.005)
        old_done_in_stream = old.finished.is_set()
        await asyncio.wait_for(asyncio.gather(*(t.finished.wait() for t in turns)), 120)
        return {
            "old_done_in_stream": old_done_in_stream,
            "preemptions": [t.preemptions for t in turns],
            "states": {t.state.name for t in turns},
            "aged": driver.counts["aged"],
        }
    finally:
        await driver.close()


@pytest.mark.parametrize("max_preemptions", [0, 1, 2])
def test_no_turn_waits_beyond_the_bound_nor_is_preempted_beyond_the_cap(max_preemptions) -> None:
    got = asyncio.run(_stream_of_trajectories(0.1, max_preemptions))
    assert got["states"] == {"FINISHED"}
    assert max(got["preemptions"]) <= max_preemptions
    assert got["aged"] > 0
    assert got["old_done_in_stream"]  # it ran while fresh trajectories kept arriving


def test_without_the_bound_the_old_turn_starves() -> None:
    """The same stream with a bound longer than the stream: the test above can fail."""
    got = asyncio.run(_stream_of_trajectories(1000.0, 1))
    assert got["states"] == {"FINISHED"}
    assert not got["old_done_in_stream"]


# ---- a migration pays by its wait saved and by its pace -----------------------------------


async def _migration_pays(predicted_total: float) -> tuple[bool, int]:
    """Two idle-slot TP2 engines of Qwen3-14B on H100 (the roofline): the source runs 64
    turns of 8k tokens, the destination none. Whether moving a trajectory with a 4k-token
    context cached at the source pays, and the migrations declined."""
    fakes = {url: FakeEngine(url, None) for url in ("http://fake0", "http://fake1")}

    def client(kind: Any, url: str, session: Any, timeout: float) -> EngineClient:
        return fakes[url]

    cfg = RolloutServerConfig(
        engines=tuple(EngineConfig(url=u, kind="sglang", tp=2, max_running=1024) for u in fakes),
        placement="heddle",
        model="qwen3-14b",
        gpu="h100",
        tokenizer="engine",
    )
    driver = RolloutDriver(cfg, client_factory=client)
    await driver.start()
    try:
        src, dst = sorted(driver.live(), key=lambda e: e.idx)
        for i in range(64):  # stand-ins for running turns: what the rule reads of them
            src.running[10_000 + i] = SimpleNamespace(prompt=[0] * 8000, generated=[])
        t = Trajectory(
            traj_id=999, key="t", prompt_id=0, group=None, declared=False,
            first_arrival_s=0.0, predicted_total=predicted_total, context=4000,
        )  # fmt: skip
        t.prefix[src.idx] = 4000
        driver.core.by_tid[t.traj_id] = t
        pays = driver.router.move_pays(t, src.idx, dst.idx)
        src.running.clear()
        return pays, driver.counts["migrations_declined"]
    finally:
        await driver.close()


def test_a_migration_that_saves_no_wait_pays_only_by_its_pace() -> None:
    # No turn waits for a slot at either engine. A trajectory with nothing left to decode
    # gains nothing by the move and is declined; one with 20k tokens still to decode
    # decodes them at the idle engine's step rather than the busy one's, which repays
    # prefilling its 4k tokens there.
    assert asyncio.run(_migration_pays(0.0)) == (False, 1)
    assert asyncio.run(_migration_pays(20_000.0)) == (True, 0)
    # near the break-even: 100 tokens repay it only because the 64 running turns' contexts
    # make the busy engine's step slower (their 512k tokens counted, not just their number)
    assert asyncio.run(_migration_pays(100.0)) == (True, 0)
