"""The emulated engine as a process on loopback, spoken to as vLLM: agents' turns end when the
simulator says (exactly, given the arrivals the engine saw; within a tolerance end to end),
streams carry the stand-in model's tokens and logprobs, aborts return what was generated,
bad requests get a 400 that names the problem."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Iterator

import httpx
import pytest
from emulated_batch import batch, config, reference, simulate

from loom.core.trajectory import TrajectorySpec
from loom.runtime.emulate import EmulatedEngine, EmulatedProcess, Request
from loom.runtime.rollout.standin import token_logprob
from loom.sim.engine import Engine

SPEC = "qwen3-14b@h100:tp2"


def wait_for(check, timeout_s: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def engine() -> Iterator[EmulatedProcess]:
    """At the GPU's own speed: a 4,000-token turn decodes for about 30 s. Shared by the
    module's tests: each reads counts relative to where it found them."""
    with EmulatedProcess(SPEC, "--scheduling-policy", "fcfs", "--max-running", "16") as e:
        yield e


# ---- timing ------------------------------------------------------------------------------------

SCALE = 0.3


async def _agents(url: str, specs: list[TrajectorySpec]) -> tuple[dict[int, float], dict]:
    """Each trajectory as an agent: its context as token ids, the tool latency slept (scaled)."""
    prompts: dict[str, list[int]] = {}
    finish: dict[int, float] = {}
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        t0 = loop.time()

        async def agent(spec: TrajectorySpec) -> None:
            ctx: list[int] = []
            for step, turn in enumerate(spec.turns):
                rng = random.Random(spec.traj_id * 1000 + step)
                ctx += [rng.randrange(3, 30000) for _ in range(turn.input_tokens)]
                rid = f"{spec.traj_id}-{step}"
                prompts[rid] = list(ctx)
                body = {
                    "prompt": ctx,
                    "max_tokens": turn.output_tokens,
                    "ignore_eos": True,
                    "request_id": rid,
                    "return_token_ids": True,
                }
                resp = await http.post("/v1/completions", json=body)
                assert resp.status_code == 200, resp.text
                out = resp.json()["choices"][0]["token_ids"]
                assert out == reference(ctx, turn.output_tokens)[0]
                ctx += out
                if turn.tool_latency_s is not None:
                    await asyncio.sleep(turn.tool_latency_s * SCALE)
            finish[spec.traj_id] = (loop.time() - t0) / SCALE

        await asyncio.gather(*(agent(s) for s in specs))
    return finish, prompts


def test_agents_turns_end_when_the_simulator_says() -> None:
    specs = batch(10, 7)
    cfg = config(max_running=4, chunk_tokens=2048)
    args = ("--scheduling-policy", "fcfs", "--max-running", "4", "--chunk-tokens", "2048")
    with EmulatedProcess(SPEC, "--time-scale", str(SCALE), *args) as e:
        finish, prompts = asyncio.run(_agents(e.url, specs))
        log = httpx.get(e.url + "/debug/requests", timeout=30).json()
    # 1. Exactly: given the instants the engine saw each request arrive, it ended each one
    # when the worker on the simulator's event clock does.
    eng = Engine()
    replay = EmulatedEngine(cfg, eng)
    ended: dict[str, float] = {}

    def send(entry: dict) -> None:
        req = replay.submit(entry["rid"], prompts[entry["rid"]], entry["max_tokens"],
                            ignore_eos=True)  # fmt: skip
        req.listener = lambda r: ended.__setitem__(r.rid, eng.now)

    for entry in log:
        eng.schedule(entry["arrival_s"], send, entry, priority=9)
    eng.run()
    assert len(log) == sum(s.num_turns for s in specs)
    for entry in log:
        assert entry["finished_s"] == pytest.approx(ended[entry["rid"]], rel=1e-9, abs=1e-9)
    # 2. End to end, the agents' view against the rollout simulator's for the same batch:
    # the difference is what HTTP, the agents and this machine's load add per turn.
    res = simulate(specs, cfg)
    slack = 0.3 / SCALE  # emulated seconds of lateness allowed per turn (0.3 s wall)
    for s in specs:
        sim = float(res.finish_s[s.traj_id])
        assert abs(finish[s.traj_id] - sim) <= 0.05 * sim + s.num_turns * slack, s.traj_id


# ---- the dialect -------------------------------------------------------------------------------


def _stream(url: str, body: dict, chunks: list[dict], seen: threading.Event | None = None):
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                chunks.append(json.loads(line[5:]))
                if (
                    seen is not None
                    and sum(len(c.get("token_ids") or []) for ch in chunks for c in ch["choices"])
                    >= 10
                ):
                    seen.set()


def test_a_stream_carries_the_models_tokens_and_logprobs(engine: EmulatedProcess) -> None:
    prompt = list(range(50, 90))
    body = {
        "model": "qwen3-14b",
        "prompt": prompt,
        "max_tokens": 300,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "logprobs": 2,
        "return_tokens_as_token_ids": True,
    }
    chunks: list[dict] = []
    _stream(engine.url, body, chunks)
    choices = [c for ch in chunks for c in ch["choices"]]
    assert len(choices) > 1  # streamed as it decodes, not all at the end
    assert choices[0]["prompt_token_ids"] == prompt
    ids = [t for c in choices for t in c["token_ids"]]
    lps = [v for c in choices for v in c["logprobs"]["token_logprobs"]]
    names = [t for c in choices for t in c["logprobs"]["tokens"]]
    assert (ids, lps) == reference(prompt, 300)
    assert names == [f"token_id:{t}" for t in ids]
    assert all(f"token_id:{t}" in c for t, c in zip(ids, (
        top for ch in choices for top in ch["logprobs"]["top_logprobs"]), strict=True))  # fmt: skip
    assert [c["finish_reason"] for c in choices][-1] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 300
    # the same prompt again: its prefix is cached; prompt logprobs in a whole answer
    again = httpx.post(
        engine.url + "/v1/completions",
        json={"prompt": prompt + ids, "max_tokens": 2, "prompt_logprobs": 1},
        timeout=60,
    ).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == len(prompt) + 300
    rows = again["choices"][0]["prompt_logprobs"]
    assert rows[0] is None and len(rows) == len(prompt) + 300
    full = prompt + ids
    assert rows[45][str(full[45])]["logprob"] == token_logprob(full[:45], full[45])


def test_text_prompts_round_trip_the_word_vocabulary(engine: EmulatedProcess) -> None:
    ids = list(range(500))
    words = httpx.post(engine.url + "/detokenize", json={"tokens": ids}, timeout=10).json()
    back = httpx.post(engine.url + "/tokenize", json={"prompt": words["prompt"]}, timeout=10)
    assert back.json()["tokens"] == ids
    out = httpx.post(
        engine.url + "/v1/completions",
        json={"prompt": "fix the bug " + words["prompt"], "max_tokens": 20, "ignore_eos": True},
        timeout=60,
    ).json()["choices"][0]
    text_ids = httpx.post(engine.url + "/tokenize", json={"prompt": out["text"]}, timeout=10)
    prompt = httpx.post(engine.url + "/tokenize", json={"prompt": "fix the bug " + words["prompt"]})
    assert text_ids.json()["tokens"] == reference(prompt.json()["tokens"], 20)[0]


def _aborted(engine: EmulatedProcess) -> int:
    return int(httpx.get(engine.url + "/debug/stats", timeout=10).json()["finished"]["abort"])


def test_an_abort_returns_what_was_generated(engine: EmulatedProcess) -> None:
    before = _aborted(engine)
    prompt = list(range(7, 40))
    chunks: list[dict] = []
    seen = threading.Event()
    body = {"prompt": prompt, "max_tokens": 4000, "ignore_eos": True, "stream": True,
            "return_token_ids": True, "request_id": "long"}  # fmt: skip
    t = threading.Thread(target=_stream, args=(engine.url, body, chunks, seen))
    t.start()
    assert seen.wait(60)
    out = httpx.post(
        engine.url + "/abort_requests", json={"request_ids": ["cmpl-long-0"]}, timeout=10
    ).json()
    t.join(60)
    assert out == {"status": "aborted", "aborted": 1}
    choices = [c for ch in chunks for c in ch["choices"]]
    ids = [i for c in choices for i in c["token_ids"]]
    assert choices[-1]["finish_reason"] == "abort" and 10 <= len(ids) < 4000
    assert ids == reference(prompt, len(ids))[0]
    stats = httpx.get(engine.url + "/debug/stats", timeout=10).json()
    assert stats["running"] == 0 and stats["finished"]["abort"] == before + 1


def test_a_client_that_goes_away_is_aborted(engine: EmulatedProcess) -> None:
    before = _aborted(engine)
    body = {"prompt": [5] * 30, "max_tokens": 4000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", engine.url + "/v1/completions", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if "token_ids" in line or "text" in line:
                break  # and close the connection mid-stream
    wait_for(lambda: _aborted(engine) == before + 1)
    metrics = httpx.get(engine.url + "/metrics", timeout=10).text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_hits_total",
        "vllm:generation_tokens_total",
    ):
        assert f'{name}{{engine="0",model_name="qwen3-14b"}}' in metrics, name
    assert 'vllm:num_requests_running{engine="0",model_name="qwen3-14b"} 0.0' in metrics


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"prompt": [1, 2], "n": 2}, 400, "n > 1"),
        ({"prompt": [1, 2], "stop": ["x"]}, 400, "stop strings"),
        ({"prompt": [1, 2], "stream": True, "prompt_logprobs": 1}, 400, "prompt_logprobs"),
        ({"prompt": [1, 2], "logit_bias": {"5": 1}}, 400, "logit_bias"),
        ({"prompt": [[1], [2]]}, 400, "one prompt per request"),
        ({"prompt": [1, -2]}, 400, "token ids must be in"),
        ({"prompt": {"a": 1}}, 400, "prompt must be"),
        ({"prompt": [1, 2], "max_tokens": "9"}, 400, "max_tokens must be an integer"),
        ({"prompt": [1, 2], "max_tokens": 0}, 400, "max_tokens must be at least 1"),
        ({"prompt": [1, 2], "max_tokens": 10**9}, 400, "maximum context length"),
        ({"prompt": [1, 2], "priority": 3}, 400, "Priority scheduling is not enabled"),
        ({"prompt": [1, 2], "model": "gpt-9"}, 404, "does not exist"),
    ],
)
def test_bad_requests_say_what_is_wrong(engine, body, status, message) -> None:
    resp = httpx.post(engine.url + "/v1/completions", json=body, timeout=10)
    assert resp.status_code == status, resp.text
    assert message in resp.json()["error"]["message"]


def test_a_body_that_is_not_json_is_refused(engine: EmulatedProcess) -> None:
    resp = httpx.post(engine.url + "/v1/completions", content=b"{nope", timeout=10)
    assert resp.status_code == 400 and "not valid JSON" in resp.json()["error"]["message"]


def test_a_full_engine_queues_the_rest() -> None:
    """Two requests at most at once: the third waits (vLLM's waiting gauge) and starts when one
    ends."""
    with EmulatedProcess(SPEC, "--max-running", "2", "--time-scale", "0.2") as e:
        results: list[Request | dict] = []
        stats = lambda: httpx.get(e.url + "/debug/stats").json()  # noqa: E731

        def go(i: int, tokens: int) -> None:
            body = {"prompt": [3 + i] * 20, "max_tokens": tokens, "ignore_eos": True}
            results.append(httpx.post(e.url + "/v1/completions", json=body, timeout=120).json())

        # the two long ones run first (about 3 s and 6 s of decoding at this scale), so the
        # third is seen waiting however late a loaded machine sends it
        threads = [threading.Thread(target=go, args=(i, n)) for i, n in enumerate((2000, 4000))]
        for t in threads:
            t.start()
        wait_for(lambda: stats()["running"] == 2)
        threads.append(threading.Thread(target=go, args=(2, 100)))
        threads[-1].start()
        wait_for(lambda: stats()["waiting"] == 1)
        for t in threads:
            t.join(120)
        log = {r["rid"]: r for r in httpx.get(e.url + "/debug/requests").json()}
    assert len(results) == 3
    # a request that arrives mid-iteration is admitted when that iteration ends (as vLLM's
    # scheduler does), so "waited" means admitted only once another request had finished
    first_end = min(r["finished_s"] for r in log.values())
    waited = [r for r in log.values() if r["admitted_s"] >= first_end]
    assert len(waited) == 1
    assert waited[0]["admitted_s"] == pytest.approx(first_end)


def test_an_engine_that_cannot_start_says_why() -> None:
    with pytest.raises(RuntimeError, match=r"(?s)did not start.*unknown model 'nonsense'"):
        EmulatedProcess("nonsense@h100")


def test_the_engine_ends_with_its_sigkilled_parent() -> None:
    """A harness (a benchmark, a test run) that starts emulated engines and is killed leaves
    none running: the engine is tethered to the process that started it."""
    import textwrap

    from process_tree import descendants, python_parent, sigkill_parent

    code = textwrap.dedent(
        f"""
        import time
        from loom.runtime.emulate import EmulatedProcess
        engine = EmulatedProcess({SPEC!r}).__enter__()
        print(engine.url, flush=True)
        time.sleep(600)
        """
    )
    with python_parent(code) as (parent, tree):
        assert parent.stdout is not None
        url = parent.stdout.readline().strip()
        assert url.startswith("http://"), f"the parent did not start an engine: {url!r}"
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        tree += descendants(parent.pid)
        assert tree, "the engine runs below its parent"
        assert sigkill_parent(parent, tree) == {}
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=5)
