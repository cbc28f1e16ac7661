"""Every route of the rollout router, as a client meets it: real HTTP on loopback in front of
stand-in SGLang engines (real processes)."""

from __future__ import annotations

import itertools
import json

import httpx
import pytest

from conftest import Rig
from loom.runtime.rollout import BackgroundRouter, EngineConfig, RolloutServerConfig
from loom.runtime.rollout.app import ROUTER_WORKER


def test_generate_returns_the_engine_shape(rig) -> None:
    r: Rig = rig(1)
    resp = r.gen(None, 12, rid="mine")
    assert resp.status_code == 200
    body = resp.json()
    assert len(body["output_ids"]) == 12
    meta = body["meta_info"]
    assert meta["id"] == "mine"
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["prompt_tokens"] == 3 and meta["completion_tokens"] == 12
    assert body["text"].split() == [f"t{t}" for t in body["output_ids"]]


def test_generate_streams_cumulative_chunks_like_sglang(rig) -> None:
    r: Rig = rig(1)
    body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 6}, "stream": True}
    with r.http.stream("POST", "/generate", json=body) as resp:
        lines = [ln for ln in resp.iter_lines() if ln.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[5:]) for ln in lines[:-1]]
    ids = [c["output_ids"] for c in chunks]
    assert all(a == b[: len(a)] for a, b in itertools.pairwise(ids))  # cumulative
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] in ("length", "stop")
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_openai_completions_stream_and_usage(rig) -> None:
    r: Rig = rig(1)
    body = {
        "model": "standin",
        "prompt": [4, 5, 6, 7],
        "max_tokens": 5,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    full = r.http.post("/v1/completions", json=body).json()
    assert full["object"] == "text_completion"
    choice = full["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 5
    assert full["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 5,
        "total_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    with r.http.stream("POST", "/v1/completions", json=body) as resp:
        lines = [ln[5:].strip() for ln in resp.iter_lines() if ln.startswith("data:")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(x) for x in lines[:-1]]
    streamed = [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids", [])]
    assert streamed == choice["token_ids"]  # same context, same tokens
    assert chunks[-1]["usage"]["completion_tokens"] == 5 and chunks[-1]["choices"] == []
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_text_prompts_are_tokenized_by_the_engine(rig) -> None:
    r: Rig = rig(1)
    body = {"prompt": "solve this task", "max_tokens": 3, "ignore_eos": True}
    out = r.http.post("/v1/completions", json=body).json()
    assert out["usage"]["prompt_tokens"] == 3
    gen = r.http.post("/generate", json={"text": "a b", "sampling_params": {"max_new_tokens": 2}})
    assert gen.json()["meta_info"]["prompt_tokens"] == 2


def test_chat_needs_a_tokenizer_or_an_engine_that_applies_a_chat_template(rig) -> None:
    r: Rig = rig(1)  # SGLang stand-ins, whose model no tokenizer loads
    resp = r.http.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
    )
    assert resp.status_code == 400
    assert "tokenizer" in resp.json()["error"]["message"]


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"X-Trajectory-Id": "k"}, {}),
        ({}, {"trajectory_id": "k"}),
        ({"X-SMG-Routing-Key": "k"}, {}),
        ({"x-session-id": "k"}, {}),
        ({}, {"session_id": "k"}),
    ],
)
def test_every_trajectory_key_clients_send_is_honoured(rig, headers, body) -> None:
    r: Rig = rig(1)
    for _ in range(2):
        req = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}, **body}
        assert r.http.post("/generate", json=req, headers=headers).status_code == 200
    view = r.http.get("/v1/trajectories/k").json()
    assert view["turns"] == 2 and view["in_flight"] == 0
    ended = r.http.post("/v1/trajectories/k/end").json()
    assert ended == {"id": "k", "turns": 2, "generated": view["generated"], "ended": True}
    assert r.http.get("/v1/trajectories/k").status_code == 404


def test_a_request_without_a_key_is_a_one_turn_trajectory(rig) -> None:
    r: Rig = rig(1)
    assert r.gen(None, 4).status_code == 200
    stats = r.stats()
    assert stats["trajectories"]["active"] == 0 and stats["policy"]["finished"] == 1


def test_turns_of_one_trajectory_may_run_together(rig) -> None:
    """Agent frameworks branch: a second request of the same trajectory is served while the
    first streams, and the trajectory counts both."""
    r: Rig = rig(1, step_ms=5)
    body = {
        "input_ids": [1],
        "sampling_params": {"max_new_tokens": 200, "ignore_eos": True},
        "stream": True,
    }
    with r.http.stream("POST", "/generate", json=body, headers={"X-Trajectory-Id": "t"}) as s:
        lines = s.iter_lines()  # kept: a dropped iterator closes the stream
        next(lines)
        second = r.gen("t", 4, prompt=[1, 2, 3, 4, 5])
        assert second.status_code == 200, second.text
        assert len(second.json()["output_ids"]) == 4
        assert r.http.get("/v1/trajectories/t").json()["in_flight"] == 1  # the first, still
        list(lines)
    view = r.http.get("/v1/trajectories/t").json()
    assert view["turns"] == 2 and view["generated"] == 204 and view["in_flight"] == 0
    assert view["context"] == 201  # the longer branch: 1 + 200


def test_declared_batch_gets_a_plan(rig) -> None:
    r: Rig = rig(2)
    batch = {
        "trajectories": [{"id": f"t{i}", "prompt": f"p{i // 2}", "group": "g"} for i in range(6)]
    }
    resp = r.http.post("/v1/rollouts", json=batch)
    assert resp.status_code == 201
    plan = resp.json()["plan"]
    assert set(plan) == {f"t{i}" for i in range(6)}
    assert set(plan.values()) <= {"e0", "e1"}
    again = r.http.post("/v1/rollouts", json={"trajectories": [{"id": "t0", "prompt_id": 1}]})
    assert again.status_code == 409
    dup = {"trajectories": [{"id": "u", "prompt_id": 1}, {"id": "u", "prompt_id": 1}]}
    assert r.http.post("/v1/rollouts", json=dup).status_code == 409
    for i in range(6):
        assert r.http.post(f"/v1/trajectories/t{i}/end").status_code == 200


@pytest.mark.parametrize(
    ("path", "content", "status", "needle"),
    [
        ("/generate", b"{not json", 400, "not valid JSON"),
        ("/generate", b"[1, 2]", 400, "JSON object"),
        (
            "/generate",
            b'{"input_ids": [1], "sampling_params": {"temperature": NaN}}',
            400,
            "not valid JSON",
        ),
        ("/generate", b'{"input_ids": [1], "sampling_params": {"top_p": 1e999}}', 400, "infinity"),
        ("/generate", b'{"input_ids": [1], "sampling_params": {"top_p": "x"}}', 400, "top_p"),
        ("/generate", b'{"input_ids": []}', 400, "non-empty"),
        ("/generate", b'{"input_ids": [1, -2]}', 400, "non-negative"),
        ("/generate", b'{"input_ids": [1, true]}', 400, "non-negative integers"),
        ("/generate", b'{"input_ids": [1, 2.0]}', 400, "non-negative integers"),
        ("/v1/completions", b'{"prompt": [1, "2"]}', 400, "non-negative integers"),
        ("/generate", b'{"input_ids": [[1], [2]]}', 400, "batched"),
        (
            "/generate",
            b'{"input_ids": [1], "sampling_params": {"max_new_tokens": 0}}',
            400,
            "generates nothing",
        ),
        ("/generate", b'{"input_ids": [1], "lora_path": "x"}', 400, "lora_path"),
        (
            "/generate",
            b'{"input_ids": [1], "sampling_params": {"frobnicate": 1}}',
            400,
            "sampling_params.frobnicate",
        ),
        ("/generate", b'{"input_ids": [1], "image_data": ["x"]}', 400, "image_data"),
        (
            "/generate",
            b'{"input_ids": [1, 2], "return_logprob": true, "logprob_start_len": 2}',
            400,
            "logprob_start_len",
        ),
        ("/v1/completions", b'{"prompt": [1], "n": 0}', 400, "n must be"),
        ("/v1/completions", b'{"prompt": [1], "guided_json": {}}', 400, "structured_outputs"),
        (
            "/v1/completions",
            b'{"prompt": [1], "allowed_token_ids": [1]}',
            400,
            "not honoured by sglang",
        ),
        ("/v1/completions", b'{"prompt": [1], "echo": true}', 400, "echo"),
        ("/v1/completions", b'{"prompt": [1], "frobnicate": 1}', 400, "frobnicate"),
        (
            "/v1/completions",
            b'{"prompt": [1], "prompt_logprobs": 1, "stream": true}',
            400,
            "streaming",
        ),
        ("/v1/completions", b'{"prompt": [1], "model": "other"}', 404, "does not exist"),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"}',
            400,
            "tool_choice",
        ),
        ("/v1/completions", b'{"prompt": ["a", "b"]}', 400, "one prompt"),
        (
            "/v1/completions",
            b'{"prompt": [1], "max_tokens": 5, "min_tokens": 9}',
            400,
            "min_tokens",
        ),
        ("/v1/chat/completions", b'{"messages": []}', 400, "non-empty"),
        ("/v1/rollouts", b'{"trajectories": [{"id": "a"}]}', 400, "prompt_id or a prompt"),
        ("/v1/rollouts", b'{"trajectories": []}', 400, "invalid batch"),
        ("/v1/trajectories/nope/end", b"", 404, "unknown trajectory"),
        ("/v1/engines", b'{"url": "ftp://x"}', 400, "http://"),
        ("/v1/engines", b'{"url": "http://127.0.0.1:1"}', 502, "unreachable"),
    ],
)
def test_bad_input_is_a_4xx_with_a_message(rig, path, content, status, needle) -> None:
    r: Rig = rig(1)
    resp = r.http.post(path, content=content, headers={"content-type": "application/json"})
    assert resp.status_code == status, resp.text
    assert needle in resp.json()["error"]["message"]


def test_oversized_bodies_are_refused(rig) -> None:
    r: Rig = rig(1, max_body_mb=0.01)
    resp = r.http.post("/generate", json={"input_ids": list(range(5000))})
    assert resp.status_code == 413
    assert "limit" in resp.json()["error"]["message"]


def test_unknown_routes_and_engines(rig) -> None:
    r: Rig = rig(1)
    assert r.http.get("/nope").status_code == 404
    assert r.http.delete("/v1/engines/e9").status_code == 404
    assert r.http.get("/v1/trajectories/zzz").status_code == 404


def test_no_engine_is_a_503_with_a_message() -> None:
    with (
        BackgroundRouter(RolloutServerConfig(port=0)) as router,
        httpx.Client(base_url=router.url, timeout=10) as http,
    ):
        resp = http.post("/generate", json={"input_ids": [1]})
        assert resp.status_code == 503 and "no live engine" in resp.json()["error"]["message"]
        assert http.get("/health").status_code == 503
        assert http.get("/v1/models").status_code == 503
        batch = {"trajectories": [{"id": "a", "prompt_id": 1}]}
        assert http.post("/v1/rollouts", json=batch).status_code == 503


def test_models_health_stats_metrics(rig) -> None:
    r: Rig = rig(2)
    r.gen("m", 5)
    assert r.http.get("/v1/models").json()["data"][0]["id"] == "standin"
    assert r.http.get("/health").json() == {"status": "ok", "engines": 2}
    stats = r.stats()
    assert stats["placement"] == "heddle" and stats["scheduler"] == "pps"
    assert set(stats["engines"]) == {"e0", "e1"}
    assert sum(e["tokens"] for e in stats["engines"].values()) == 5
    assert stats["policy"]["decisions"] == 1
    # the engine that ran the turn has a measured pace; the other none yet
    paces = sorted(
        ((e["turn_s"], e["start_s"], e["token_s"]) for e in stats["engines"].values()),
        key=lambda p: p[0] is None,
    )
    (turn_s, start_s, token_s), idle = paces
    # (tokens that arrive in one read leave no time between them: >= 0, not > 0)
    assert 0 < start_s <= turn_s and token_s >= 0
    assert idle == (None, None, None)
    text = r.http.get("/metrics").text
    for name in (
        "loom_rollout_request_seconds_bucket",
        "loom_rollout_queueing_seconds_count",
        'loom_rollout_generated_tokens_total{engine="e',
        'loom_rollout_engine_turns{engine="e0",state="running"}',
        "loom_rollout_preemptions_total",
    ):
        assert name in text, name


def test_engines_are_added_and_drained_while_running(rig) -> None:
    from conftest import start_standin

    r: Rig = rig(1)
    extra = start_standin()
    r.engines.append(extra)
    added = r.http.post("/v1/engines", json={"url": extra.url, "tp": 2, "max_running": 8})
    assert added.status_code == 201
    assert added.json()["id"] == "e1" and added.json()["tp"] == 2
    assert r.http.post("/v1/engines", json={"url": extra.url}).status_code == 409
    assert [e["id"] for e in r.http.get("/v1/engines").json()["engines"]] == ["e0", "e1"]
    assert r.http.delete("/v1/engines/e0").status_code == 202
    assert r.gen(None, 3).status_code == 200  # served by e1
    assert list(r.stats()["engines"]) == ["e1"]
    last = r.http.delete("/v1/engines/e1")
    assert last.status_code == 202  # idle: it may go
    assert r.gen(None, 3).status_code == 503


def test_gateway_shaped_worker_registry(rig) -> None:
    from conftest import start_standin

    r: Rig = rig(1)
    extra = start_standin()
    r.engines.append(extra)
    resp = r.http.post("/workers", json={"url": extra.url, "worker_type": "regular"})
    assert resp.status_code == 202 and resp.json()["worker_id"] == "e1"
    again = r.http.post("/workers", json={"url": extra.url, "worker_type": "regular"})
    assert again.status_code == 202 and again.json()["worker_id"] == "e1"  # the same worker
    pd = r.http.post(
        "/workers", json={"url": extra.url, "worker_type": "prefill", "bootstrap_port": 9000}
    )
    assert pd.status_code == 400 and "prefill" in pd.json()["error"]["message"]
    workers = r.http.get("/workers").json()
    assert workers["total"] == 3 and workers["stats"]["regular_count"] == 3
    # each engine at its own url (a launcher finds itself there), the router first: a
    # client that aborts every url and reads its loads reaches the turns waiting here too
    assert [w["url"] for w in workers["workers"]] == [r.router.url, r.engines[0].url, extra.url]
    assert [w["id"] for w in workers["workers"]] == [ROUTER_WORKER, "e0", "e1"]
    assert r.http.get("/workers/e1").json()["url"] == extra.url
    assert r.http.get(f"/workers/{ROUTER_WORKER}").json()["runtime_type"] == "router"
    for verb in ("put", "delete"):
        wrong = r.http.request(verb, f"/workers/{ROUTER_WORKER}", json={})
        assert wrong.status_code == 400 and "not an engine" in wrong.json()["error"]["message"]
    loads = r.http.get("/v1/loads").json()["loads"]
    assert {x["worker"] for x in loads} == {r.engines[0].url, extra.url, "router"}
    assert r.http.delete("/workers/e1").status_code == 202
    assert r.http.get("/workers/e1").status_code == 404  # it was idle: gone
    assert r.http.post("/add_worker", params={"url": extra.url}).status_code == 200
    urls = [r.router.url, r.engines[0].url, extra.url]
    assert r.http.get("/list_workers").json()["urls"] == urls
    assert r.http.post("/remove_worker", params={"url": r.engines[0].url}).status_code == 200


def test_incremental_sglang_streams_are_read_as_well(rig) -> None:
    r: Rig = rig(1, engine_args=("--incremental",))
    out = r.gen(None, 9).json()
    assert len(out["output_ids"]) == 9
    assert out["text"].split() == [f"t{t}" for t in out["output_ids"]]


def test_engines_with_a_token_get_it_and_the_router_has_its_own() -> None:
    """An engine that wants a bearer token (vLLM --api-key, `loom serve engine --token`)
    gets it on every call; the router's own token guards the router."""
    from conftest import start_standin

    engine = start_standin(2.0, 64, "--token", "engine-token-0123456789")
    try:
        assert httpx.post(engine.url + "/generate", json={"input_ids": [1]}).status_code == 401
        cfg = RolloutServerConfig(
            port=0,
            token="router-token-0123456789",
            engines=(EngineConfig(url=engine.url, token="engine-token-0123456789"),),
        )
        with BackgroundRouter(cfg) as router, httpx.Client(base_url=router.url) as http:
            body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3}}
            refused = http.post("/generate", json=body)
            assert refused.status_code == 401 and "token" in refused.json()["error"]["message"]
            assert http.get("/health").status_code == 200  # health is open
            auth = {"Authorization": "Bearer router-token-0123456789"}
            out = http.post("/generate", json=body, headers=auth)
            assert out.status_code == 200 and len(out.json()["output_ids"]) == 3
    finally:
        engine.kill()
