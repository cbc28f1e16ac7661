"""The rollout policies driven for real: every placement and scheduler over stand-in engines
(real processes, real HTTP), preemption and resume, engine failure mid-turn, drains, the
online predictor, and determinism of decisions.

The stand-in's next token is a function of the whole context, so a turn that was aborted and
resumed must produce exactly the tokens of an uninterrupted one."""

from __future__ import annotations

import itertools
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import Rig
from loom.rollout.policy import PlacementKind, SchedulerKind
from loom.runtime.rollout import BackgroundRouter, EngineConfig, RolloutServerConfig
from loom.runtime.rollout.standin import continuation


def expected(prompt: list[int], n: int) -> list[int]:
    return continuation(prompt, n)[0]


def run_trajectory(r: Rig, key: str, turns: int, tokens: int) -> list[int]:
    """A multi-turn trajectory: each turn's prompt is the context so far plus a tool output."""
    context = [11, 12, 13]
    lengths = []
    for k in range(turns):
        out = r.gen(key, tokens, prompt=context).json()
        assert out["meta_info"]["finish_reason"]["type"] == "length", out
        lengths.append(len(out["output_ids"]))
        assert out["output_ids"] == expected(context, tokens)
        context = context + out["output_ids"] + [100 + k]  # the tool's reply
    assert r.http.post(f"/v1/trajectories/{key}/end").status_code == 200
    return lengths


@pytest.mark.parametrize("placement", list(PlacementKind))
@pytest.mark.parametrize("scheduler", list(SchedulerKind))
def test_every_policy_serves_a_batch_without_loss_or_overload(rig, placement, scheduler) -> None:
    r: Rig = rig(2, max_running=2, placement=placement, scheduler=scheduler)
    keys = [f"t{i}" for i in range(6)]
    batch = {"trajectories": [{"id": k, "prompt_id": i // 2} for i, k in enumerate(keys)]}
    assert r.http.post("/v1/rollouts", json=batch).status_code == 201
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda k: run_trajectory(r, k, 3, 8), keys))
    assert results == [[8, 8, 8]] * 6
    stats = r.stats()
    assert stats["policy"]["turns"] == 18 and stats["policy"]["finished"] == 6
    assert stats["policy"]["decisions"] >= 18
    assert stats["trajectories"]["active"] == 0
    for s in r.engines:  # the router's admission: never more than max_running at an engine
        assert s.get("/debug/stats")["max_seen"] <= 2
    assert sum(e["tokens"] for e in stats["engines"].values()) >= 6 * 3 * 8


def _stream_tokens(
    r: Rig, key: str, prompt: list[int], n: int, seen: threading.Event, after: int, out: list[int]
) -> None:
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": n, "ignore_eos": True},
        "stream": True,
    }
    with r.http.stream("POST", "/generate", json=body, headers={"X-Trajectory-Id": key}) as s:
        for line in s.iter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            out[:] = chunk["output_ids"]
            if len(out) >= after:
                seen.set()


def test_preemption_aborts_the_lowest_priority_turn_and_resumes_it_exactly(rig) -> None:
    r: Rig = rig(1, step_ms=4, max_running=1, placement="least_load", scheduler="pps")
    prompt = [1, 2, 3]
    first = r.gen("long", 2, prompt=prompt).json()["output_ids"]
    prompt2 = prompt + first + [50]
    seen, out = threading.Event(), []
    n = 400  # 1.6 s of decoding: it still runs when a loaded machine sends the fresh turn
    t = threading.Thread(target=_stream_tokens, args=(r, "long", prompt2, n, seen, 20, out))
    t.start()
    assert seen.wait(30)
    # a trajectory on its first step outranks one past it under PPS (plan first, §4.1)
    short = r.gen("fresh", 10, prompt=[9, 9]).json()
    t.join(60)
    assert short["output_ids"] == expected([9, 9], 10)
    assert out == expected(prompt2, n)  # nothing lost but the recompute
    log = r.engines[0].get("/debug/requests")
    attempts = [q for q in log if q["input_ids"][: len(prompt2)] == prompt2]
    assert len(attempts) == 2
    k = len(attempts[1]["input_ids"]) - len(prompt2)
    assert k >= 20
    assert attempts[1]["input_ids"] == prompt2 + out[:k]  # exactly prompt + generated
    assert attempts[1]["max_new_tokens"] == n - k  # only the tokens it still lacks
    assert attempts[0]["rid"] in r.engines[0].get("/debug/stats")["aborted"]
    stats = r.stats()
    assert stats["policy"]["preemptions"] == 1 and stats["engines"]["e0"]["preempted"] == 1
    # the resumed attempt prefilled again all the evicted turn had computed
    assert stats["reprefill_tokens"]["preemption"] == len(attempts[1]["input_ids"])
    assert stats["reprefill_tokens"]["placement"] == 0  # its second turn found its prefix
    for key in ("long", "fresh"):
        r.http.post(f"/v1/trajectories/{key}/end")


def test_non_preemptive_schedulers_never_preempt(rig) -> None:
    r: Rig = rig(1, step_ms=4, max_running=1, placement="least_load", scheduler="fcfs")
    r.gen("a", 2)
    seen, out = threading.Event(), []
    t = threading.Thread(target=_stream_tokens, args=(r, "a", [4, 4], 60, seen, 5, out))
    t.start()
    assert seen.wait(30)
    r.gen("b", 5)
    t.join(60)
    assert r.stats()["policy"]["preemptions"] == 0 and len(out) == 60
    for key in ("a", "b"):
        r.http.post(f"/v1/trajectories/{key}/end")


def wait_for(cond, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _engine_of(r: Rig, key: str) -> int:
    eid = r.http.get(f"/v1/trajectories/{key}").json()["engine"]
    return int(eid[1:])


@pytest.mark.parametrize("fault", ["kill", "crash", "hang"])
def test_a_turn_survives_its_engine_failing_mid_turn(rig, fault) -> None:
    r: Rig = rig(
        2,
        step_ms=10,  # 2 s of decoding: still running when a loaded machine gets to the fault
        placement="cache_aware",
        scheduler="fcfs",
        stall_timeout_s=0.5,
        health_interval_s=0.2,
    )
    prompt = [7, 8, 9]
    seen, out = threading.Event(), []
    t = threading.Thread(target=_stream_tokens, args=(r, "f", prompt, 200, seen, 30, out))
    t.start()
    assert seen.wait(30)
    victim = r.engines[_engine_of(r, "f")]
    if fault == "kill":
        victim.kill()
    else:
        victim.fault(fault)
    t.join(60)
    assert out == expected(prompt, 200)  # every token, in order, once
    other = r.engines[1 - r.engines.index(victim)]
    resumed = [q for q in other.get("/debug/requests") if q["input_ids"][:3] == prompt]
    assert len(resumed) == 1
    k = len(resumed[0]["input_ids"]) - 3
    assert k >= 30 and resumed[0]["max_new_tokens"] == 200 - k
    stats = r.stats()
    assert stats["policy"]["failovers"] >= 1
    eid = f"e{r.engines.index(victim)}"
    # the fault holds on every route (health included): the engine is out while it lasts
    assert stats["engines"][eid]["alive"] is False
    if fault != "kill":  # an engine that answers its health checks again comes back
        victim.fault("none")
        wait_for(lambda: r.stats()["engines"][eid]["alive"], 30)
        victim.fault(fault)  # and fails again: the next turn must not go there
        wait_for(lambda: not r.stats()["engines"][eid]["alive"], 30)
    # the next turn of the trajectory goes to the live engine
    assert r.gen("f", 5, prompt=prompt + out).status_code == 200
    assert _engine_of(r, "f") == r.engines.index(other)
    r.http.post("/v1/trajectories/f/end")


def test_when_the_last_engine_dies_the_turn_fails_with_a_message(rig) -> None:
    r: Rig = rig(1, step_ms=3, health_interval_s=0.2)
    seen, out = threading.Event(), []
    body = {"input_ids": [1], "sampling_params": {"max_new_tokens": 500, "ignore_eos": True}}

    def kill_later() -> None:  # once the turn runs there
        wait_for(lambda: r.stats()["engines"]["e0"]["tokens"] > 0, 60)
        r.engines[0].kill()

    threading.Thread(target=kill_later).start()
    resp = r.http.post("/generate", json=body)
    assert resp.status_code == 503
    assert "no live engine" in resp.json()["error"]["message"]
    del seen, out


def test_a_client_that_goes_away_aborts_its_request_at_the_engine(rig) -> None:
    r: Rig = rig(1, step_ms=4)
    body = {"input_ids": [3], "sampling_params": {"max_new_tokens": 400}, "stream": True}
    with r.http.stream("POST", "/generate", json=body, headers={"X-Trajectory-Id": "g"}) as s:
        lines = s.iter_lines()
        next(lines)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if r.engines[0].get("/debug/stats")["aborted"]:
            break
        time.sleep(0.05)
    assert len(r.engines[0].get("/debug/stats")["aborted"]) == 1
    view = r.http.get("/v1/trajectories/g").json()
    assert view["in_flight"] == 0 and 0 < view["generated"] < 400
    r.http.post("/v1/trajectories/g/end")


def test_draining_an_engine_moves_its_queue_and_finishes_its_running_turns(rig) -> None:
    r: Rig = rig(2, step_ms=3, max_running=1, placement="cache_aware", scheduler="fcfs")
    batch = {"trajectories": [{"id": f"d{i}", "prompt_id": i} for i in range(4)]}
    plan = r.http.post("/v1/rollouts", json=batch).json()["plan"]
    on_e0 = [k for k, e in plan.items() if e == "e0"]
    assert len(on_e0) == 2
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(r.gen, k, 300) for k in on_e0]  # 0.9 s each
        wait_for(lambda: r.stats()["engines"]["e0"]["tokens"] > 0, 30)  # one runs, one waits
        assert r.http.delete("/v1/engines/e0").status_code == 202
        outs = [f.result().json() for f in futures]
    assert [len(o["output_ids"]) for o in outs] == [300, 300]
    assert "e0" not in r.stats()["engines"]
    assert sum(1 for q in r.engines[1].get("/debug/requests")) >= 1
    for k in plan:
        r.http.post(f"/v1/trajectories/{k}/end")


@pytest.mark.parametrize("low_first", [False, True])
def test_the_engine_gets_the_scheduler_key_as_priority_when_it_schedules_by_priority(
    rig, low_first
) -> None:
    """A stand-in that says it schedules by priority (SGLang's server info) gets the fcfs key
    as each request's `priority`, in its own sign convention: SGLang runs higher values
    first unless started with --schedule-low-priority-values-first."""
    flags = ("--priority", "--low-priority-first") if low_first else ("--priority",)
    r: Rig = rig(1, engine_args=flags, scheduler="fcfs")
    for i in range(3):
        assert r.gen(f"p{i}", 2).status_code == 200
    prios = [q["priority"] for q in r.engines[0].get("/debug/requests")]
    assert len(prios) == 3 and all(isinstance(p, int) for p in prios)
    assert prios == (sorted(prios) if low_first else sorted(prios, reverse=True))
    assert len(set(prios)) == 3
    for i in range(3):
        r.http.post(f"/v1/trajectories/p{i}/end")


def test_an_engine_that_does_not_schedule_by_priority_gets_none(rig) -> None:
    r: Rig = rig(1)
    assert r.gen("np", 2).status_code == 200
    assert [q["priority"] for q in r.engines[0].get("/debug/requests")] == [None]
    assert r.stats()["engines"]["e0"]["priority"] is False
    r.http.post("/v1/trajectories/np/end")


def _decisions(rig) -> tuple[dict[str, str], list[int]]:
    r: Rig = rig(3, max_running=2)
    batch = {"trajectories": [{"id": f"x{i}", "prompt_id": i % 3} for i in range(9)]}
    plan = r.http.post("/v1/rollouts", json=batch).json()["plan"]
    engines = []
    for k in itertools.chain.from_iterable(itertools.repeat([f"x{i}" for i in range(9)], 2)):
        r.gen(k, 4 + len(engines) % 5)
        engines.append(_engine_of(r, k))
    for i in range(9):
        r.http.post(f"/v1/trajectories/x{i}/end")
    return plan, engines


def test_decisions_are_deterministic(rig) -> None:
    assert _decisions(rig) == _decisions(rig)


def test_the_predictor_learns_from_the_routers_history_and_keeps_it(rig, tmp_path: Path) -> None:
    state = tmp_path / "state"
    r: Rig = rig(1, state_dir=state, refit_every=8)
    for i in range(40):
        r.gen(f"h{i}", 2 + i % 7, prompt=[i % 5 + 1, 2])
        r.http.post(f"/v1/trajectories/h{i}/end")
    deadline = time.monotonic() + 30
    while not r.stats()["predictor"]["fitted"] and time.monotonic() < deadline:
        time.sleep(0.1)
    pred = r.stats()["predictor"]
    assert pred["history"] == 40 and pred["fitted"] and pred["fits"] >= 1
    lines = (state / "history.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert len(lines) == 40 and first["turns"] == [
        {"input_tokens": 2, "output_tokens": 2, "tool_latency_s": None}
    ]
    r.router.stop()
    again = BackgroundRouter(
        RolloutServerConfig(port=0, engines=(EngineConfig(url=r.engines[0].url),), state_dir=state)
    ).start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pred = again.call(lambda d: d.stats()["predictor"])
            if pred["fitted"]:
                break
            time.sleep(0.1)
        assert pred["history"] == 40 and pred["fitted"]
    finally:
        again.stop()
    r.router = BackgroundRouter(RolloutServerConfig(port=0)).start()
