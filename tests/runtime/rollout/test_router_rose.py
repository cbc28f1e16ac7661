"""ROSE's elastic scheduler behind `loom serve rollout --placement rose`, over stand-in engines
(real processes, real HTTP): dedicated engines first, then lent ones with room and slack, then
the central queue; weight versions; lent engines joining, leaving, stalling and dying mid-turn,
with every turn finishing exactly as an uninterrupted one would."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from conftest import Rig, Standin, start_standin, wait_for
from loom.runtime.rollout.standin import continuation


def expected(prompt: list[int], n: int) -> list[int]:
    return continuation(prompt, n)[0]


def add_lent(r: Rig, step_ms: float, engine: Standin | None = None) -> tuple[str, Standin]:
    """Register a lent stand-in engine (a new one unless given)."""
    if engine is None:
        engine = start_standin(step_ms, 64)
        r.engines.append(engine)  # stopped with the rig
    resp = r.http.post("/v1/engines", json={"url": engine.url, "lent": True, "max_running": 64})
    assert resp.status_code == 201, resp.text
    return resp.json()["id"], engine


def running_on(r: Rig, key: str) -> str | None:
    resp = r.http.get(f"/v1/trajectories/{key}")
    if resp.status_code != 200:
        return None
    view = resp.json()
    return view["engine"] if "running" in view["states"] else None


def turn(r: Rig, key: str, n: int, prompt: list[int]) -> list[int]:
    out = r.gen(key, n, prompt=prompt).json()
    assert out["meta_info"]["finish_reason"]["type"] == "length", out
    r.http.post(f"/v1/trajectories/{key}/end")
    return out["output_ids"]


def test_dedicated_first_then_lent_then_the_central_queue(rig) -> None:
    r: Rig = rig(1, step_ms=10, max_running=8, placement="rose", rose_cap_per_gpu=1)
    lent, _ = add_lent(r, 10)
    prompts = {"a": [1, 2], "b": [3, 4], "c": [5, 6]}
    with ThreadPoolExecutor(3) as pool:
        # a and b run for seconds: both still hold their engines when c comes
        a = pool.submit(turn, r, "a", 300, prompts["a"])
        assert wait_for(lambda: running_on(r, "a")) == "e0"  # dedicated first
        b = pool.submit(turn, r, "b", 200, prompts["b"])
        assert wait_for(lambda: running_on(r, "b")) == lent  # dedicated full: the lent one
        c = pool.submit(turn, r, "c", 20, prompts["c"])
        wait_for(lambda: r.stats()["held"] == 1)  # both at their cap: the central queue
        outs = {"a": a.result(60), "b": b.result(60), "c": c.result(60)}
    for key, out in outs.items():
        assert out == expected(prompts[key], len(out)) and len(out) in (300, 200, 20)
    stats = r.stats()
    assert stats["policy"]["held"] == 1 and stats["held"] == 0
    assert stats["engines"][lent]["lent"] is True and stats["engines"]["e0"]["lent"] is False
    for engine in r.engines:  # the cap: one running turn per GPU, never more
        assert engine.get("/debug/stats")["max_seen"] <= 1


def test_a_lent_engine_takes_turns_only_with_room_slack_and_current_weights(rig) -> None:
    r: Rig = rig(1, step_ms=10, max_running=8, placement="rose", rose_cap_per_gpu=1)
    lent, _ = add_lent(r, 2)
    patch = lambda body: r.http.patch(f"/v1/engines/{lent}", json=body)  # noqa: E731
    assert patch({"slack_s": -0.05}).status_code == 200  # serving is behind its SLO
    with ThreadPoolExecutor(3) as pool:
        a = pool.submit(turn, r, "a", 700, [1])  # holds the dedicated engine throughout
        wait_for(lambda: running_on(r, "a"))
        b = pool.submit(turn, r, "b", 20, [2, 2])
        wait_for(lambda: r.stats()["held"] == 1)
        assert patch({"slack_s": 0.2, "free_tokens": 2}).status_code == 200  # 3 tokens: no room
        time.sleep(0.3)
        assert r.stats()["held"] == 1
        assert patch({"free_tokens": 1000}).json()["free_tokens"] == 1000
        assert b.result(30) == expected([2, 2], 20)  # placed at once, done on the lent engine
        # new weights: the dedicated engine has them, the lent one not yet
        w = r.http.put("/v1/weights", json={"version": 1, "engines": ["e0"]}).json()
        assert w == {"version": 1, "current": ["e0"], "behind": [lent]}
        c = pool.submit(turn, r, "c", 20, [3, 3])
        wait_for(lambda: r.stats()["held"] == 1)  # e0 full, the lent engine is stale
        assert not a.done()
        assert patch({"version": 1}).json()["version"] == 1  # it pulled the weights
        assert c.result(30) == expected([3, 3], 20)
        assert not a.done()  # c did not wait for the dedicated engine
        assert a.result(60) == expected([1], 700)
    stats = r.stats()
    assert stats["weights_version"] == 1 and stats["policy"]["held"] == 2
    assert stats["engines"][lent]["tokens"] == 40


def test_bad_reports_and_weights_are_refused_with_a_reason(rig) -> None:
    r: Rig = rig(1, placement="rose")
    bad = [
        ("patch", "/v1/engines/nope", {"slack_s": 1}, 404, "unknown engine"),
        ("patch", "/v1/engines/e0", {"free_tokens": -1}, 400, "free_tokens"),
        ("patch", "/v1/engines/e0", {"bogus": 1}, 400, "bogus"),
        ("put", "/v1/weights", {"engines": []}, 400, "version"),
        ("put", "/v1/weights", {"version": 1, "engines": ["nope"]}, 404, "nope"),
    ]
    for method, path, body, status, words in bad:
        resp = getattr(r.http, method)(path, json=body)
        assert resp.status_code == status and words in resp.text, (path, body, resp.text)
    assert r.http.put("/v1/weights", json={"version": 2, "engines": ["e0"]}).status_code == 200
    resp = r.http.put("/v1/weights", json={"version": 1})
    assert resp.status_code == 409 and "older" in resp.text
    resp = r.http.patch("/v1/engines/e0", json={"version": 1})
    assert resp.status_code == 409 and "older" in resp.text
    assert r.http.get("/v1/weights").json()["version"] == 2


def _stream(r: Rig, key: str, prompt: list[int], n: int, out: list[int], seen: threading.Event):
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": n, "ignore_eos": True},
        "stream": True,
    }
    with r.http.stream("POST", "/generate", json=body, headers={"X-Trajectory-Id": key}) as s:
        for line in s.iter_lines():
            if line.startswith("data:") and not line.endswith("[DONE]"):
                out[:] = json.loads(line[5:])["output_ids"]
                if len(out) >= 10:
                    seen.set()


# the lent engine's turn, and the dedicated engine's (twice as long): seconds of decoding at
# 5 ms a step, so both still run when a loaded machine gets round to the interruption
LENT_TURN = 400


def _lent_turn_interrupted(r: Rig, lent: str, interrupt: Callable[[], None]) -> list[int]:
    """A long turn holds the dedicated engine; a second streams on the lent engine until
    `interrupt`; its output when it finishes (elsewhere)."""
    with ThreadPoolExecutor(1) as pool:
        a = pool.submit(turn, r, "a", 2 * LENT_TURN, [1])
        wait_for(lambda: running_on(r, "a") == "e0")
        out: list[int] = []
        seen = threading.Event()
        t = threading.Thread(target=_stream, args=(r, "b", [9, 9], LENT_TURN, out, seen))
        t.start()
        assert seen.wait(30) and running_on(r, "b") == lent
        interrupt()
        t.join(60)
        assert a.result(60) == expected([1], 2 * LENT_TURN)
    r.http.post("/v1/trajectories/b/end")
    return out


def test_a_stalled_lent_engine_gives_its_turn_back_with_the_partial_output(rig) -> None:
    r: Rig = rig(1, step_ms=5, placement="rose", rose_cap_per_gpu=1, lent_stall_timeout_s=0.5)
    lent, engine = add_lent(r, 5)
    out = _lent_turn_interrupted(r, lent, lambda: engine.fault("hang"))
    assert out == expected([9, 9], LENT_TURN)  # nothing lost, nothing twice
    stats = r.stats()
    assert stats["policy"]["stalls"] == 1 and stats["policy"]["failovers"] == 1
    view = stats["engines"][lent]
    assert view["alive"] is True and view["stalled"] is True  # serving first, not broken
    resumed = [q for q in r.engines[0].get("/debug/requests") if q["input_ids"][:2] == [9, 9]]
    assert len(resumed) == 1 and resumed[0]["max_new_tokens"] == LENT_TURN - (
        len(resumed[0]["input_ids"]) - 2
    )  # it asked only for the tokens still missing
    engine.fault("none")
    assert r.http.patch(f"/v1/engines/{lent}", json={"slack_s": 0.1}).json()["stalled"] is False


def test_a_lent_engine_killed_mid_turn(rig) -> None:
    r: Rig = rig(1, step_ms=5, placement="rose", rose_cap_per_gpu=1, health_interval_s=0.5)
    lent, engine = add_lent(r, 5)
    out = _lent_turn_interrupted(r, lent, engine.kill)
    assert out == expected([9, 9], LENT_TURN)
    stats = r.stats()
    assert stats["engines"][lent]["alive"] is False and stats["policy"]["failovers"] >= 1


def test_lent_engines_join_and_leave_while_a_batch_runs(rig) -> None:
    r: Rig = rig(1, step_ms=3, placement="rose", rose_cap_per_gpu=2)
    keys = [f"t{i}" for i in range(8)]

    def trajectory(key: str) -> list[int]:
        context = [int(key[1:]) + 1]
        for k in range(3):
            out = r.gen(key, 60, prompt=context).json()["output_ids"]
            assert out == expected(context, 60)
            context = context + out + [200 + k]
        r.http.post(f"/v1/trajectories/{key}/end")
        return context

    spare = start_standin(3, 64)
    r.engines.append(spare)
    with ThreadPoolExecutor(8) as pool:
        results = [pool.submit(trajectory, k) for k in keys]
        wait_for(lambda: r.stats()["held"] > 0)  # two slots for eight trajectories
        lent, _ = add_lent(r, 3, spare)
        wait_for(lambda: r.stats()["engines"][lent]["tokens"] > 0)
        assert r.http.delete(f"/v1/engines/{lent}").status_code == 202  # given back mid-batch
        contexts = [f.result(120) for f in results]
    assert all(len(c) == 1 + 3 * 61 for c in contexts)
    stats = r.stats()
    assert lent not in stats["engines"]  # drained and forgotten
    assert stats["policy"]["finished"] == 8 and stats["held"] == 0
    assert r.engines[0].get("/debug/stats")["max_seen"] <= 2


def test_every_turn_of_a_trajectory_stays_with_its_prefix(rig) -> None:
    r: Rig = rig(2, step_ms=2, placement="rose")
    keys = [f"t{i}" for i in range(6)]

    def trajectory(key: str) -> None:
        context = [7, int(key[1:])]
        for k in range(3):
            out = r.gen(key, 12, prompt=context).json()["output_ids"]
            context = context + out + [300 + k]
        r.http.post(f"/v1/trajectories/{key}/end")

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(trajectory, keys))
    homes: dict[int, set[int]] = {}
    for i, engine in enumerate(r.engines):
        for q in engine.get("/debug/requests"):
            homes.setdefault(q["input_ids"][1], set()).add(i)
    assert len(homes) == 6 and all(len(h) == 1 for h in homes.values())
    assert {next(iter(h)) for h in homes.values()} == {0, 1}  # both engines used
