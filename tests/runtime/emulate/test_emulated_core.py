"""The emulated engine is the simulator's worker: the same batch, sent as requests by agents
on the simulator's event clock, ends every turn at the instant the rollout simulator ends it,
with the stand-in model's tokens."""

from __future__ import annotations

import random

import pytest
from emulated_batch import batch, config, simulate

from loom.core.errors import ConfigError, InvalidRequest
from loom.core.topology import GpuType
from loom.core.trajectory import TrajectorySpec
from loom.rollout.baselines import CacheAwareRouter
from loom.rollout.engine_queue import EngineQueue, EngineSchedulingPolicy
from loom.rollout.policy import WorkerLayout
from loom.runtime.emulate import EmulatedEngine, EmulatedEngineConfig, EmulationSpec, Request
from loom.runtime.rollout.standin import next_token
from loom.sim.engine import Engine
from loom.sim.rollout.simulator import RolloutConfig, RolloutSimulator


def emulate(
    specs: list[TrajectorySpec], cfg: EmulatedEngineConfig, core: EmulatedEngine | None = None
):
    """Agents on the event clock: each turn sends the whole context (prompt, earlier outputs,
    tool replies) as token ids, and the next one a tool latency after the answer."""
    core = core or EmulatedEngine(cfg, Engine())
    eng = core.eng
    finish: dict[int, float] = {}
    outputs: dict[int, list[list[int]]] = {s.traj_id: [] for s in specs}
    contexts: dict[int, list[int]] = {}

    def send(spec: TrajectorySpec, step: int) -> None:
        rng = random.Random(spec.traj_id * 1000 + step)
        ctx = contexts.setdefault(spec.traj_id, [])
        ctx += [rng.randrange(3, 30000) for _ in range(spec.turns[step].input_tokens)]
        req = core.submit(
            f"{spec.traj_id}-{step}",
            list(ctx),
            spec.turns[step].output_tokens,
            ignore_eos=True,
        )
        req.listener = lambda r: answered(spec, step, r)

    def answered(spec: TrajectorySpec, step: int, req: Request) -> None:
        assert req.finish_reason == "length"
        out = req.gen.tokens
        outputs[spec.traj_id].append(out)
        contexts[spec.traj_id] += out
        tool = spec.turns[step].tool_latency_s
        if tool is None:
            finish[spec.traj_id] = eng.now
        else:
            eng.after(tool, send, spec, step + 1)

    for s in specs:
        send(s, 0)
    eng.run()
    return core, finish, outputs, contexts


@pytest.mark.parametrize("seed", [0, 1])
def test_the_same_batch_ends_every_trajectory_when_the_simulator_does(seed):
    specs = batch(40, seed)
    cfg = config(max_running=16, chunk_tokens=2048)
    res = simulate(specs, cfg)
    core, finish, outputs, contexts = emulate(specs, cfg)
    assert [finish[s.traj_id] for s in specs] == pytest.approx(list(res.finish_s), rel=1e-12)
    assert core.worker.prefill_tokens == res.prefill_tokens
    assert core.worker.cached_hit_tokens == res.cache_hit_tokens > 0
    assert core.worker.preemptions == res.preemptions
    # token for token: the stand-in model over each context
    for s in specs:
        prompt_len = 0
        for step, out in enumerate(outputs[s.traj_id]):
            prompt_len += s.turns[step].input_tokens
            ctx = contexts[s.traj_id][:prompt_len]
            for tok in out:
                assert tok == next_token(ctx)
                ctx.append(tok)
            prompt_len += len(out)
            assert len(out) == s.turns[step].output_tokens


def test_kv_pressure_preempts_and_evicts_as_the_simulator_does():
    # Long turns on a worker whose KV holds a few of them: preemptions and evictions. NOTE:
    # the emulator also keeps a finished trajectory's last context cached (it cannot know the
    # trajectory ended) where the simulator drops it; least recently used first, it is
    # evicted before it matters here, but another batch could see it differ.
    specs = batch(24, 3, long=True)
    cfg = config(max_running=64, decode_reserve=256)
    lat = cfg.latency()
    small = type(
        "Small",
        (),
        {
            "tp": 2,
            "num_gpus": 2,
            "kv_capacity_tokens": 30_000,
            "iteration_time": staticmethod(lat.iteration_time),
        },
    )()
    sim = RolloutSimulator(
        specs,
        WorkerLayout(degrees=(2,)),
        EngineQueue(policy=EngineSchedulingPolicy.FCFS),
        CacheAwareRouter(),
        RolloutConfig(max_running=64, decode_reserve=256, requeue_in_place=True),
        latency=lambda tp: small,  # type: ignore[arg-type,return-value]
    )
    res = sim.run()
    core = EmulatedEngine(cfg, Engine())
    core.worker.lat = small  # type: ignore[assignment]
    core.worker.capacity = core.capacity = 30_000
    core.max_model_len = 30_000
    _, finish, _, _ = emulate(specs, cfg, core)
    assert res.preemptions > 0
    assert (core.worker.preemptions, core.worker.prefill_tokens) == (
        res.preemptions,
        res.prefill_tokens,
    )
    assert core.worker.peak_used <= 30_000
    assert [finish[s.traj_id] for s in specs] == pytest.approx(list(res.finish_s), rel=1e-12)


def test_an_abort_ends_a_request_with_what_it_generated_and_keeps_its_kv():
    cfg = config()
    eng = Engine()
    core = EmulatedEngine(cfg, eng)
    prompt = list(range(100, 1100))
    req = core.submit("a", prompt, 500, ignore_eos=True)
    ended: list[Request] = []
    req.listener = ended.append
    half = None

    def cut() -> None:
        nonlocal half
        half = dict(core.progress())[req]
        assert core.abort("a") == 1

    eng.after(1.0, cut)  # emulated seconds: the prompt's prefill is long done
    eng.run()
    assert ended == [req] and req.finish_reason == "abort"
    assert 0 < half <= req.output_len < 500
    # resumed with prompt + what it generated: the prefix is found cached, and the tokens are
    # the ones the uninterrupted request would have produced next
    rest = core.submit("b", prompt + req.gen.tokens[: req.output_len], 500 - req.output_len,
                       ignore_eos=True)  # fmt: skip
    eng.run()
    assert rest.cached == len(prompt) + req.output_len
    whole = core.submit("c", prompt, 500, ignore_eos=True)
    eng.run()
    assert req.gen.tokens[: req.output_len] + rest.gen.tokens == whole.gen.tokens
    assert core.finished == {"stop": 0, "length": 2, "abort": 1}


def test_priority_orders_the_queue_and_fcfs_refuses_priorities():
    spec = EmulationSpec.parse("qwen3-8b@h200")
    eng = Engine()
    core = EmulatedEngine(EmulatedEngineConfig(spec=spec, max_running=1), eng)
    order: list[str] = []
    for rid, prio in (("first", 0), ("low", 5), ("high", -5), ("mid", 1)):
        core.submit(rid, list(range(3, 40)), 10, ignore_eos=True, priority=prio).listener = (
            lambda r: order.append(r.rid)
        )
    eng.run()
    assert order == ["first", "high", "mid", "low"]
    fcfs = EmulatedEngine(config(), Engine())
    with pytest.raises(InvalidRequest, match="Priority scheduling is not enabled"):
        fcfs.submit("x", [5, 6, 7], 3, priority=1)
    with pytest.raises(InvalidRequest, match="maximum context length"):
        fcfs.submit("x", [5, 6, 7], fcfs.max_model_len)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("qwen3-14b", "MODEL@GPU"),
        ("qwen3-14b@h900", "unknown GPU type"),
        ("nope@h100", "unknown model"),
        ("qwen3-14b@h100:tp3", "tp=3"),
    ],
)
def test_a_bad_spec_says_what_is_wrong(text, error):
    with pytest.raises(ConfigError, match=error):
        EmulationSpec.parse(text)


def test_spec_round_trips():
    spec = EmulationSpec.parse("Qwen3-14B@H100:tp2")
    assert (spec.model, spec.gpu, spec.tp) == ("qwen3-14b", GpuType.H100, 2)
    assert str(spec) == "qwen3-14b@h100:tp2"
