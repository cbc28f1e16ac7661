"""slime's whole lifecycle against the router, over stand-in SGLang engines (real processes,
real HTTP), in the request sequences slime sends (`slime_replay`, read from slime's code):
engines register themselves, rollouts come with `return_logprob`, the end-of-step abort loop
(v0.3.1's, with `/v1/loads`, and the older single abort) ends every turn, those still waiting
in the router included, and reads the router idle; an engine slime shuts down finds itself in
`GET /workers`, is deregistered, drains (its running turn finishes there, or resumes
elsewhere once slime has killed it) and is removed, never counted as failed."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import slime_replay as slime

from conftest import Rig, Standin, start_standin, wait_for
from loom.runtime.rollout.app import ROUTER_WORKER
from loom.runtime.rollout.standin import continuation

expected = continuation


def slime_fleet(rig: Callable[..., Rig], n: int, *, max_running: int, old: bool = False) -> Rig:
    """A router started with no engine (slime is given its address) and `n` stand-ins that
    register themselves as slime's engines do; each says it runs `max_running` at once."""
    r = rig(0, max_running=None, health_interval_s=0.5)
    engines = [start_standin(5.0, max_running) for _ in range(n)]
    r.engines.extend(engines)
    for e in engines:
        (slime.register_old if old else slime.register)(r.router.url, e.url)
    return r


def in_router(r: Rig) -> dict[str, int]:
    """Turns running at engines and turns waiting in the router, as its stats say."""
    s = r.stats()
    engines = s["engines"].values()
    return {
        "running": sum(e["running"] for e in engines),
        "waiting": sum(e["waiting"] for e in engines) + s["held"],
        "tokens": min((e["tokens"] for e in engines), default=0),
    }


def two_running_two_waiting(r: Rig) -> bool:
    s = in_router(r)
    return s["running"] == 2 and s["waiting"] == 2 and s["tokens"] > 0


def router_load(r: Rig) -> int:
    return slime.num_requests(r.http.get("/v1/loads", params={"include": "core"}).json())


def long_turns(pool: ThreadPoolExecutor, r: Rig, n: int) -> list[Future[httpx.Response]]:
    """`n` rollouts of 3000 tokens (15 s on a stand-in): all are in flight at the abort."""
    return [
        pool.submit(r.http.post, "/generate", json=slime.generate_body([7, i], 3000))
        for i in range(n)
    ]


def check_aborted(outs: list[dict[str, Any]]) -> None:
    """Each ends abort with what it generated: its tokens and logprobs exactly the
    stand-in's, a prefix of the 3000 asked for (none for a turn that never started)."""
    for i, out in enumerate(outs):
        tokens, lps, finish = slime.read_output(out)
        assert finish == "abort", out["meta_info"]
        assert len(tokens) < 3000
        assert (tokens, lps) == expected([7, i], len(tokens))


def check_idle(r: Rig) -> None:
    wait_for(lambda: all(e.get("/debug/stats")["running"] == 0 for e in r.engines))
    assert router_load(r) == 0
    policy = r.stats()["policy"]
    assert policy["aborted"] == 4 and policy["failovers"] == 0


# ---- registration and rollouts ---------------------------------------------------------------


@pytest.mark.parametrize("old", [False, True], ids=["workers", "add_worker"])
def test_engines_register_themselves_and_serve_slimes_rollouts(rig, old: bool) -> None:
    r = slime_fleet(rig, 2, max_running=4, old=old)
    workers = r.http.get("/workers").json()["workers"]
    assert [w["url"] for w in workers] == [r.router.url, *(e.url for e in r.engines)]
    assert workers[0]["id"] == ROUTER_WORKER and workers[0]["runtime_type"] == "router"
    assert all(w["worker_type"] == "regular" for w in workers)
    assert r.http.get("/list_workers").json()["urls"] == [w["url"] for w in workers]
    out = r.http.post("/generate", json=slime.generate_body([3, 4, 5], 12)).json()
    tokens, lps, finish = slime.read_output(out)
    assert (tokens, lps) == expected([3, 4, 5], 12) and finish == "length"
    assert out["output_ids"] == tokens and out["meta_info"]["completion_tokens"] == 12


# ---- the end-of-step abort -------------------------------------------------------------------


def test_slimes_abort_loop_ends_every_turn_and_reads_the_router_idle(rig) -> None:
    """slime >= v0.3.1: every listed url is aborted and its `/v1/loads` read until zero, all
    at once. Each engine runs one turn; two more wait in the router, which only its own
    entry's abort reaches."""
    r = slime_fleet(rig, 2, max_running=1)
    with ThreadPoolExecutor(4) as pool:
        futures = long_turns(pool, r, 4)
        wait_for(lambda: two_running_two_waiting(r))
        loops = slime.abort_until_idle(r.router.url, interval_s=1.0)
        outs = [f.result(60).json() for f in futures]
    assert [loop.url for loop in loops] == [r.router.url, *(e.url for e in r.engines)]
    for loop in loops:
        assert loop.gave_up is None and loop.loads[-1] == 0, loop
    # the two that waited in the router ended by the router's own abort (an engine's, sent
    # at the same time, may end the running ones first: their slots then take the waiting
    # ones, which the router's abort ends there)
    assert sum(a["aborted"] for a in loops[0].aborts) >= 2
    check_aborted(outs)
    check_idle(r)


@pytest.mark.parametrize(
    ("listing", "together"),
    [("/workers", True), ("/list_workers", False)],
    ids=["v0.2.3-v0.3.0", "sglang-router-0.2"],
)
def test_slimes_older_single_abort_ends_every_turn(rig, listing: str, together: bool) -> None:
    """slime before v0.3.1: one `abort_all` per listed url, then it waits for its rollouts.
    With sglang-router <= 0.2.1 the urls come from `/list_workers` (and the engines register
    with `/add_worker`), one url after another."""
    r = slime_fleet(rig, 2, max_running=1, old=listing == "/list_workers")
    with ThreadPoolExecutor(4) as pool:
        futures = long_turns(pool, r, 4)
        wait_for(lambda: two_running_two_waiting(r))
        answers = slime.abort_once(r.router.url, listing=listing, together=together)
        outs = [f.result(60).json() for f in futures]
    assert list(answers) == [r.router.url, *(e.url for e in r.engines)]
    assert not any(isinstance(a, BaseException) for a in answers.values()), answers
    check_aborted(outs)
    check_idle(r)


# ---- deregistration at shutdown --------------------------------------------------------------


def _running_on(r: Rig) -> tuple[str, Standin]:
    """The engine (id, process) the one turn in flight runs on, once it has tokens out."""

    def find() -> tuple[str, Standin] | None:
        for eid, e in r.stats()["engines"].items():
            if e["running"] and e["tokens"] > 10:
                return eid, next(p for p in r.engines if p.url == e["url"])
        return None

    return wait_for(find)


@pytest.mark.parametrize("how", ["slime", "remove_worker"])
def test_an_engine_slime_shuts_down_is_drained_and_removed_not_failed(rig, how: str) -> None:
    """slime's shutdown: `GET /workers`, its own entry, `DELETE /workers/{id}` (sglang-router
    <= 0.2.1: `POST /remove_worker?url=`), then it kills the engine at once. The turn
    running there resumes on the other engine and returns exactly what an uninterrupted one
    would; the engine leaves the registry; nothing counts as failed."""
    r = slime_fleet(rig, 2, max_running=8, old=how == "remove_worker")
    with ThreadPoolExecutor(1) as pool:
        f = pool.submit(r.http.post, "/generate", json=slime.generate_body([9, 9], 600))
        eid, victim = _running_on(r)
        if how == "slime":
            assert slime.deregister(r.router.url, victim.url) == eid  # it found itself
        else:
            slime.deregister_old(r.router.url, victim.url)
        victim.kill()
        out = f.result(60).json()
    tokens, lps, finish = slime.read_output(out)
    assert (tokens, lps) == expected([9, 9], 600) and finish == "length"
    other = next(e for e in r.engines if e is not victim)
    wait_for(lambda: eid not in r.stats()["engines"])
    assert [w["url"] for w in r.http.get("/workers").json()["workers"]] == [
        r.router.url,
        other.url,
    ]
    stats = r.stats()
    assert stats["policy"]["failovers"] == 0 and stats["policy"]["moved"] == 1
    assert stats["policy"]["removed"] == 1
    assert all(e["failed_turns"] == 0 for e in stats["engines"].values())
    # the other, idle, goes at once: its entry is gone when DELETE answers
    other_id = slime.deregister(r.router.url, other.url)
    other.kill()
    assert other_id is not None and r.http.get(f"/workers/{other_id}").status_code == 404
    assert r.stats()["policy"]["removed"] == 2 and r.stats()["policy"]["failovers"] == 0


def test_a_deregistered_engine_that_stays_finishes_its_turn_there(rig) -> None:
    """sglang-router 0.2.x's `DELETE /workers/{url}` with the engine left running: its turn
    finishes where it is, and the engine is removed once it has."""
    r = slime_fleet(rig, 2, max_running=8)
    with ThreadPoolExecutor(1) as pool:
        f = pool.submit(r.http.post, "/generate", json=slime.generate_body([4, 4], 300))
        eid, engine = _running_on(r)
        slime.deregister_by_url(r.router.url, engine.url)
        assert r.http.get(f"/workers/{eid}").json()["draining"] is True
        out = f.result(60).json()
    assert slime.read_output(out)[:2] == expected([4, 4], 300)
    assert len(engine.get("/debug/requests")) == 1  # it was never moved
    wait_for(lambda: eid not in r.stats()["engines"])
    assert r.stats()["policy"]["failovers"] == 0 and r.stats()["policy"]["removed"] == 1


def test_the_last_engine_may_go_and_slime_retries_its_turn_on_the_next(rig) -> None:
    """slime stops an engine whatever the router answers, so the gateway's DELETE is never
    refused, not even for the last engine. Its running turn, with no engine left to resume
    on, ends 503; slime's post retries it (once a second, up to 60 times) and the engine
    that registers next (slime's recovery) serves it."""
    r = slime_fleet(rig, 1, max_running=8)
    body = slime.generate_body([6, 1], 400)
    with ThreadPoolExecutor(1) as pool:
        f = pool.submit(r.http.post, "/generate", json=body)
        eid, victim = _running_on(r)
        assert slime.deregister(r.router.url, victim.url) == eid
        victim.kill()
        assert f.result(60).status_code == 503
    assert r.http.get("/workers").json()["total"] == 1  # the router's own entry
    fresh = start_standin(5.0, 8)
    r.engines.append(fresh)
    slime.register(r.router.url, fresh.url)
    out = r.http.post("/generate", json=body).json()
    assert slime.read_output(out) == (*expected([6, 1], 400), "length")
    policy = r.stats()["policy"]
    assert policy["failovers"] == 0 and policy["removed"] == 1 and policy["moved"] == 0


def test_an_engine_registered_again_while_draining_is_taken_back(rig) -> None:
    r = slime_fleet(rig, 1, max_running=8)
    with ThreadPoolExecutor(1) as pool:
        f = pool.submit(r.http.post, "/generate", json=slime.generate_body([2, 2], 300))
        eid, engine = _running_on(r)
        slime.deregister(r.router.url, engine.url)
        assert slime.register(r.router.url, engine.url).json()["worker_id"] == eid
        assert r.http.get(f"/workers/{eid}").json()["draining"] is False
        f.result(60)
    assert r.gen(None, 3).status_code == 200 and eid in r.stats()["engines"]
    assert r.http.delete(f"/workers/{ROUTER_WORKER}").status_code == 400
