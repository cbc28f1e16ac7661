"""What RL frameworks rely on, over stand-in engines (real processes, real HTTP): logprobs
exact across preemption and failover, aborts that return what was generated, requests of one
trajectory in flight together, a client that goes away withdrawn at once, and text prompts
that survive an engine that is dead, idle-dead or hung."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from conftest import Rig, wait_for
from loom.runtime.rollout.standin import (
    continuation,
    routed_experts,
    token_logprob,
    top_logprobs,
)

expected = continuation


def stream(
    r: Rig,
    body: dict[str, Any],
    key: str | None,
    seen: threading.Event,
    after: int,
    chunks: list[dict[str, Any]],
) -> None:
    headers = {"X-Trajectory-Id": key} if key else {}
    with r.http.stream("POST", "/generate", json={**body, "stream": True}, headers=headers) as s:
        for line in s.iter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunks.append(json.loads(line[5:]))
            if len(chunks[-1].get("output_ids", ())) >= after:
                seen.set()


def logprob_body(prompt: list[int], n: int, **extra: Any) -> dict[str, Any]:
    return {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": n, "ignore_eos": True},
        "return_logprob": True,
        **extra,
    }


# ---- logprobs --------------------------------------------------------------------------------


def test_logprobs_in_sglangs_shapes_are_the_engines(rig) -> None:
    r: Rig = rig(1)
    prompt = [9, 8, 7, 6]
    out = r.http.post(
        "/generate", json=logprob_body(prompt, 6, logprob_start_len=1, top_logprobs_num=2)
    ).json()
    ids, lps = expected(prompt, 6)
    meta = out["meta_info"]
    assert out["output_ids"] == ids
    assert meta["output_token_logprobs"] == [[lp, t, None] for lp, t in zip(lps, ids, strict=True)]
    ctx = list(prompt)
    for j, t in enumerate(ids):  # the 2 most likely, best first, as SGLang
        best = sorted(dict(top_logprobs(ctx, 2)).items(), key=lambda kv: -kv[1])
        assert meta["output_top_logprobs"][j] == [[v, k, None] for k, v in best]
        ctx.append(t)
    assert meta["input_token_logprobs"] == [
        [token_logprob(prompt[:i], prompt[i]), prompt[i], None] for i in range(1, 4)
    ]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["weight_version"] == "0" and meta["prompt_tokens"] == 4


def test_logprobs_in_openai_shapes(rig) -> None:
    r: Rig = rig(1)
    prompt = [5, 6, 7]
    ids, lps = expected(prompt, 4)
    out = r.http.post(
        "/v1/completions",
        json={
            "model": "standin",
            "prompt": prompt,
            "max_tokens": 4,
            "ignore_eos": True,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
        },
    ).json()
    lp = out["choices"][0]["logprobs"]
    assert lp["tokens"] == [f"token_id:{t}" for t in ids] and lp["token_logprobs"] == lps
    assert all(
        next(iter(top)) == f"token_id:{t}" for top, t in zip(lp["top_logprobs"], ids, strict=True)
    )
    scored = r.http.post(
        "/v1/completions",
        json={"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 0},
    ).json()["choices"][0]["prompt_logprobs"]
    assert scored[0] is None
    assert [row[str(t)]["logprob"] for row, t in zip(scored[1:], prompt[1:], strict=True)] == [
        token_logprob(prompt[:i], prompt[i]) for i in (1, 2)
    ]


@pytest.mark.parametrize("fault", ["preempt", "kill", "hang"])
def test_a_resumed_turn_returns_exactly_the_uninterrupted_logprobs(rig, fault) -> None:
    """Every token the client gets comes with the logprob under the engine that sampled it,
    in order, none twice, none missing, across a preemption or a failover."""
    r: Rig = rig(
        2,
        step_ms=10,
        max_running=1,
        placement="least_load",
        scheduler="pps",
        stall_timeout_s=0.5,
        health_interval_s=0.2,
    )
    prompt = [1, 2, 3]
    n = 300  # 3 s of decoding: still running when a loaded machine gets round to the fault
    if fault == "preempt":  # one engine: a younger, shorter trajectory outranks the long one
        r.http.delete("/v1/engines/e1")
    seen, chunks = threading.Event(), []
    body = logprob_body(prompt, n, top_logprobs_num=1)
    t = threading.Thread(target=stream, args=(r, body, "long", seen, 20, chunks))
    t.start()
    assert seen.wait(30)
    if fault == "preempt":  # SGLang's priority: higher runs first
        assert r.gen("short", 3, prompt=[40], priority=10).status_code == 200
    else:
        running = [e for e in r.engines if e.get("/debug/stats")["running"]]
        assert running, f"the turn ended before the fault: {len(chunks)} chunks"
        victim = running[0]
        victim.kill() if fault == "kill" else victim.fault("hang")
    t.join(60)
    last = chunks[-1]
    ids, lps = expected(prompt, n)
    assert last["output_ids"] == ids
    assert last["meta_info"]["output_token_logprobs"] == [
        [lp, t, None] for lp, t in zip(lps, ids, strict=True)
    ]
    assert len(last["meta_info"]["output_top_logprobs"]) == n
    stats = r.stats()["policy"]
    assert stats["preemptions" if fault == "preempt" else "failovers"] >= 1
    for key in ("long", "short"):
        r.http.post(f"/v1/trajectories/{key}/end")


def test_routed_experts_are_the_last_attempts_over_the_whole_sequence(rig) -> None:
    """slime's routing replay: `return_routed_experts` reaches SGLang engines, and a resumed
    turn answers with the routing its last engine computed over prompt and output."""
    r: Rig = rig(1, step_ms=4, max_running=1, placement="least_load", scheduler="pps")
    seen, chunks = threading.Event(), []
    body = {**logprob_body([1, 2, 3], 400), "return_routed_experts": True}  # runs 1.6 s
    t = threading.Thread(target=stream, args=(r, body, "moe", seen, 20, chunks))
    t.start()
    assert seen.wait(30)
    assert r.gen("short", 3, prompt=[40], priority=10).status_code == 200  # preempts it
    t.join(60)
    final = chunks[-1]
    assert r.stats()["policy"]["preemptions"] >= 1
    assert final["meta_info"]["routed_experts"] == routed_experts([1, 2, 3, *final["output_ids"]])
    plain = r.gen(None, 3).json()["meta_info"]
    assert "routed_experts" not in plain  # only when asked
    for key in ("moe", "short"):
        r.http.post(f"/v1/trajectories/{key}/end")


# ---- aborts ----------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["rid", "abort_all"])
def test_abort_returns_what_was_generated_marked_abort(rig, how) -> None:
    r: Rig = rig(1, step_ms=5, max_running=1)
    seen, chunks = threading.Event(), []
    running = logprob_body([3, 4], 500, rid="slime-1")
    t = threading.Thread(target=stream, args=(r, running, None, seen, 10, chunks))
    t.start()
    assert seen.wait(30)
    with ThreadPoolExecutor(1) as pool:  # a second request waits: the engine takes one
        queued = pool.submit(r.http.post, "/generate", json=logprob_body([5], 50, rid="slime-2"))
        wait_for(lambda: r.stats()["engines"]["e0"]["waiting"] == 1)
        body = {"rid": "slime-1"} if how == "rid" else {"abort_all": True}
        assert r.http.post("/abort_request", json=body).json()["aborted"] >= 1
        t.join(30)
        if how == "rid":
            r.http.post("/abort_request", json={"rid": "slime-2"})
        waited = queued.result(30).json()
    final = chunks[-1]
    n = len(final["output_ids"])
    assert 10 <= n < 500
    assert final["meta_info"]["finish_reason"]["type"] == "abort"
    ids, lps = expected([3, 4], n)
    assert final["output_ids"] == ids  # what it generated, with its logprobs
    assert [x[0] for x in final["meta_info"]["output_token_logprobs"]] == lps
    assert waited["meta_info"]["finish_reason"]["type"] == "abort"
    assert waited["output_ids"] == [] and waited["meta_info"]["output_token_logprobs"] == []
    wait_for(lambda: r.engines[0].get("/debug/stats")["running"] == 0)  # stopped there too
    assert r.stats()["policy"]["aborted"] >= 2


def test_vllms_abort_route_and_openai_request_ids(rig) -> None:
    r: Rig = rig(1, step_ms=5)
    with ThreadPoolExecutor(1) as pool:
        f = pool.submit(
            r.http.post,
            "/v1/completions",
            json={"prompt": [1], "max_tokens": 500, "ignore_eos": True, "request_id": "oa-1"},
        )
        wait_for(lambda: r.stats()["engines"]["e0"]["tokens"] > 5)
        out = r.http.post("/abort_requests", json={"request_ids": ["cmpl-oa-1-0"]}).json()
        assert out == {"status": "aborted", "aborted": 1}
        choice = f.result(30).json()["choices"][0]
    assert choice["finish_reason"] == "abort" and choice["text"]


def test_an_engines_own_abort_reaches_the_client_as_an_abort(rig) -> None:
    """slime aborts engines itself at the end of a step: the turn ends, it is not resumed."""
    r: Rig = rig(1, step_ms=5)
    with ThreadPoolExecutor(1) as pool:
        f = pool.submit(r.gen, None, 500)
        wait_for(lambda: r.engines[0].get("/debug/stats")["running"])
        rid = r.engines[0].get("/debug/requests")[-1]["rid"]
        httpx.post(r.engines[0].url + "/abort_request", json={"rid": rid}, timeout=10)
        out = f.result(30).json()
    assert out["meta_info"]["finish_reason"]["type"] == "abort" and len(out["output_ids"]) > 0
    assert len(r.engines[0].get("/debug/requests")) == 1  # not sent again
    assert r.stats()["policy"]["failovers"] == 0


# ---- concurrency and clients that leave ------------------------------------------------------


def test_n_samples_are_siblings_sharing_the_prompt(rig) -> None:
    r: Rig = rig(2)
    out = r.http.post(
        "/generate",
        json={
            "input_ids": [4, 5],
            "sampling_params": {"max_new_tokens": 6, "n": 3, "sampling_seed": 7},
        },
    ).json()
    assert isinstance(out, list) and [o["index"] for o in out] == [0, 1, 2]
    seeds = sorted(
        q["sampling_params"]["sampling_seed"] for e in r.engines for q in e.get("/debug/requests")
    )
    assert seeds == [7, 8, 9]  # sample i seeded seed + i, as vLLM
    chat = r.http.post("/v1/completions", json={"prompt": [4, 5], "max_tokens": 3, "n": 2})
    assert [c["index"] for c in chat.json()["choices"]] == [0, 1]
    assert chat.json()["usage"]["completion_tokens"] == 6


def test_a_client_that_times_out_is_withdrawn_at_once(rig) -> None:
    """A queued turn whose client gave up leaves the queue at once; the trajectory's next
    request, sent right after, is served (never a 409 behind the abandoned turn)."""
    r: Rig = rig(1, step_ms=5, max_running=1)
    with ThreadPoolExecutor(1) as pool:
        blocker = pool.submit(r.gen, "other", 300)
        wait_for(lambda: r.stats()["engines"]["e0"]["running"] == 1)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                r.router.url + "/generate",
                json={"input_ids": [1], "sampling_params": {"max_new_tokens": 5}},
                headers={"X-Trajectory-Id": "agent"},
                timeout=0.5,
            )
        wait_for(lambda: r.stats()["engines"]["e0"]["waiting"] == 0, 10)
        assert r.stats()["policy"]["abandoned"] == 1
        again = pool.submit(r.gen, "agent", 5)
        assert again.result(60).status_code == 200
        blocker.result(60)
    for key in ("agent", "other"):
        r.http.post(f"/v1/trajectories/{key}/end")


# ---- text prompts ----------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["kill", "hang", "unhealthy"])
def test_text_prompts_survive_a_dead_or_hung_engine(rig, fault) -> None:
    """No tokenizer loads for the stand-ins' model: text goes to an engine's /tokenize, each
    call with a deadline, another engine when one fails; an idle engine that died is never
    the one every text request waits on."""
    r: Rig = rig(2, engine_call_timeout_s=1.0, health_interval_s=30.0)
    victim = r.engines[0]  # idle, and first in the tokenizer's order
    victim.kill() if fault == "kill" else victim.fault(fault)
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        outs = list(
            pool.map(
                lambda i: r.http.post(
                    "/v1/completions", json={"prompt": f"w{i} x y", "max_tokens": 3}
                ),
                range(8),
            )
        )
    assert [o.status_code for o in outs] == [200] * 8, [o.text for o in outs]
    assert all(o.json()["usage"]["prompt_tokens"] == 3 for o in outs)
    assert time.monotonic() - started < 60  # nothing waited on the hung engine for long
