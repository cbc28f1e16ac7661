"""The emulated lent serving instance (ROSE §4.1) is the simulator's co-serving worker, not a
copy: on one trace of serving requests and rollout turns, its serving TTFTs and TPOTs and its
rollout turns' ends equal those of `CoServingWorker` driven alone, for a prefiller and a
decoder; serving keeps its SLO while rollout turns run beside it; settings are checked; and
served over HTTP (`python -m loom.runtime.emulate SPEC --coserve MODEL --role ROLE`), it
answers both models' requests, the RL step, and what serving saw."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from loom.core.errors import ConfigError, InvalidRequest
from loom.core.trajectory import TrajectorySpec, TurnSpec
from loom.perf.latency import RooflineLatencyModel
from loom.perf.specs import model_spec
from loom.rollout.engine_queue import EngineQueue, EngineSchedulingPolicy
from loom.rollout.rose.admission import Role, ServingSlo
from loom.rollout.rose.memory import MemorySharing, lent_memory
from loom.runtime.emulate import EmulatedProcess
from loom.runtime.emulate.config import CoServeSettings, EmulatedEngineConfig, EmulationSpec
from loom.runtime.emulate.coserve import CoServingEngine
from loom.sim.engine import Engine
from loom.sim.rollout.coserve import CoServeConfig, CoServingWorker, ServingRequest
from loom.sim.rollout.state import TrajState

SPEC = "qwen3-8b@h800"
SERVING = "qwen2.5-7b"


def _trace(seed: int) -> tuple[list[tuple[float, int, int]], list[tuple[float, int, int]]]:
    """Serving requests (arrival, prompt, output) in bursts, and rollout turns (arrival,
    prompt, output) over 20 s."""
    rng = random.Random(seed)
    serving, t = [], 0.0
    while t < 20:
        t += rng.expovariate(8.0 if int(t) % 5 < 2 else 1.0)  # a burst two seconds in five
        serving.append((t, rng.randint(200, 2000), rng.randint(20, 300)))
    rollout = [
        (rng.uniform(0, 15), rng.randint(500, 4000), rng.randint(50, 800)) for _ in range(24)
    ]
    return serving, sorted(rollout)


def _reference(role: Role, seed: int) -> tuple[list[tuple[float, float]], list[float]]:
    """The simulator's worker alone: each serving request's (first token, finish) and each
    rollout turn's end."""
    spec = EmulationSpec.parse(SPEC)
    settings = CoServeSettings(serving_model=SERVING, role=role)
    eng = Engine()
    cfg = CoServeConfig(
        role=role,
        slo=ServingSlo(ttft_s=settings.ttft_s, tpot_s=settings.tpot_s),
        admission=settings.admission,
        memory=lent_memory(spec.gpu, spec.model, SERVING, spec.tp, settings.lease_s),
    )
    ends: dict[int, float] = {}
    served: dict[int, tuple[float, float]] = {}

    def done(req: ServingRequest, _w: CoServingWorker) -> None:
        served[req.req_id] = (req.first_token_s, req.finish_s if role == Role.DECODE else 0.0)

    w = CoServingWorker(
        idx=0,
        tp=spec.tp,
        node=0,
        latency=RooflineLatencyModel(spec.gpu, spec.model, tp=spec.tp),
        serving_latency=RooflineLatencyModel(spec.gpu, SERVING, tp=spec.tp),
        rollout_kv_bytes=model_spec(spec.model).kv_bytes_per_token,
        serving_kv_bytes=model_spec(SERVING).kv_bytes_per_token,
        config=cfg,
        memory=MemorySharing(cfg.memory),
        scheduler=EngineQueue(policy=EngineSchedulingPolicy.FCFS),
        engine=eng,
        max_running=settings.max_running_per_gpu * spec.tp,
        on_turn_done=lambda t, _w: ends.__setitem__(t.traj_id, eng.now),
        on_abort=lambda t, _w, why: pytest.fail(f"rollout turn aborted: {why}"),
        on_prefilled=done if role == Role.PREFILL else None,
        on_served=done,
        requeue_in_place=True,
    )
    w.set_version(0)
    w.begin_step(0)
    serving, rollout = _trace(seed)
    for i, (at, p, o) in enumerate(serving):

        def arrive(i: int = i, p: int = p, o: int = o, at: float = at) -> None:
            req = ServingRequest(i, at, p, o)
            if role == Role.DECODE:
                req.first_token_s = at
                w.serve_decode(req)
            else:
                w.serve_prefill(req)

        eng.schedule(at, arrive)
    for i, (at, p, o) in enumerate(rollout):
        spec_ = TrajectorySpec(
            traj_id=i, prompt_id=0, sample_idx=0, workload=None, turns=(TurnSpec(p, o, None),)
        )
        eng.schedule(at, lambda s=spec_, at=at: w.enqueue(_arrived(s, at)))
    eng.run()
    return [served[i] for i in range(len(serving))], [ends[i] for i in range(len(rollout))]


def _arrived(spec: TrajectorySpec, at: float) -> TrajState:
    t = TrajState(spec, ())
    t.first_arrival_s = at
    return t


def _emulated(role: Role, seed: int) -> tuple[list[tuple[float, float]], list[float], dict]:
    eng = Engine()
    cfg = EmulatedEngineConfig(
        spec=EmulationSpec.parse(SPEC),
        scheduling_policy=EngineSchedulingPolicy.FCFS,
        max_model_len=40_000,
    )
    engine = CoServingEngine(cfg, eng, CoServeSettings(serving_model=SERVING, role=role))
    served: dict[int, tuple[float, float]] = {}
    ends: dict[int, float] = {}
    serving, rollout = _trace(seed)

    def done(req: ServingRequest) -> None:
        served[req.req_id] = (req.first_token_s, req.finish_s if role == Role.DECODE else 0.0)

    for at, p, o in serving:
        eng.schedule(at, lambda p=p, o=o: engine.serve(p, o, done))
    for i, (at, p, o) in enumerate(rollout):
        prompt = [1 + (i * 7 + j) % 5000 for j in range(p)]

        def arrive(i: int = i, prompt: list[int] = prompt, o: int = o) -> None:
            req = engine.submit(f"r{i}", prompt, o, ignore_eos=True)
            req.listener = lambda r, i=i: ends.__setitem__(i, r.finished_s)

        eng.schedule(at, arrive)
    eng.run()
    return (
        [served[i] for i in range(len(serving))],
        [ends[i] for i in range(len(rollout))],
        engine.serving_stats(),
    )


@pytest.mark.parametrize("role", [Role.PREFILL, Role.DECODE])
def test_the_emulated_instance_is_the_simulators_worker_on_one_trace(role: Role) -> None:
    for seed in (1, 2):
        served, ends = _reference(role, seed)
        e_served, e_ends, stats = _emulated(role, seed)
        assert e_served == pytest.approx(served, abs=1e-9)
        assert e_ends == pytest.approx(ends, abs=1e-9)
        assert stats["served"] == stats["ended"] == len(served)
        assert stats["reclaimed"] == stats["stalled"] == 0
        # serving keeps its SLO with rollout turns beside it (the dual-SLO rule)
        assert stats["slo_attainment"] >= 0.99


def test_co_serving_settings_and_requests_are_checked() -> None:
    with pytest.raises(ConfigError, match="model"):
        CoServeSettings(serving_model="no-such-model")
    with pytest.raises(ConfigError):
        CoServeSettings(serving_model=SERVING, role="colocated")
    with pytest.raises(ConfigError):
        CoServeSettings(serving_model=SERVING, role="sideways")
    cfg = EmulatedEngineConfig(spec=EmulationSpec.parse(SPEC))
    engine = CoServingEngine(cfg, Engine(), CoServeSettings(serving_model=SERVING))
    with pytest.raises(InvalidRequest, match=">= 1 token"):
        engine.serve(0, 10)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_lent_engine_serves_both_models_over_http(role: str) -> None:
    with (
        EmulatedProcess(SPEC, "--coserve", SERVING, "--role", role, "--time-scale", "0.05") as e,
        httpx.Client(base_url=e.url, timeout=120) as http,
    ):
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["qwen3-8b", SERVING]

        def serving(i: int) -> dict:
            body = {"model": SERVING, "prompt": [5 + i] * 800, "max_tokens": 40}
            resp = http.post("/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
            return resp.json()

        def rollout(i: int) -> dict:
            body = {"prompt": [9 + i] * 3000, "max_tokens": 200, "ignore_eos": True}
            resp = http.post("/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
            return resp.json()

        with ThreadPoolExecutor(12) as pool:
            rolls = [pool.submit(rollout, i) for i in range(4)]
            serves = [pool.submit(serving, i) for i in range(8)]
            served = [f.result()["loom_serving"] for f in serves]
            turns = [f.result() for f in rolls]
        assert all(t["usage"]["completion_tokens"] == 200 for t in turns)
        assert {s["role"] for s in served} == {role}
        key, slo = ("ttft_s", 0.5) if role == "prefill" else ("tpot_s", 0.15)
        assert all(0 < s[key] <= slo for s in served)  # the SLO of its role, kept
        stats = http.get("/loom/coserve").json()
        assert stats["served"] == stats["ended"] == 8 and stats["slo_attainment"] == 1.0
        assert stats["role"] == role and stats["reclaimed"] == 0
        assert http.post("/loom/coserve/step", json={"step": 1}).json() == {"step": 1}
        for bad, what in (
            ({"model": SERVING, "prompt": [1], "max_tokens": 0}, "max_tokens"),
            ({"model": SERVING, "prompt": [1], "stream": True}, "cannot stream"),
            ({"model": SERVING, "prompt": [1], "logprobs": 1}, "logprobs"),
            ({"model": SERVING, "prompt": {}}, "prompt must be"),
        ):
            resp = http.post("/v1/completions", json=bad)
            assert resp.status_code == 400 and what in resp.text, resp.text
        for bad in ({"step": -1}, {"step": 1, "extra": 2}, {"step": True}):
            assert http.post("/loom/coserve/step", json=bad).status_code == 400
