"""A lent serving instance co-serving the rollout (ROSE §4.1): the rollout's pages stay within
what serving leaves, serving never waits for them, leases expire, dual-SLO admission keeps
serving TPOT within its SLO and an arriving prefill waits at most one rollout iteration, and
without admission control the TTFT tail grows."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rose_world import (
    SERVING_LAT,
    SLO,
    WL,
    checked,
    hooks,
    lent_slice,
    make_rollout,
    output_tokens,
    rollout_limit_tokens,
    short_day,
    specs,
    trace,
)

from loom.core.errors import ConfigError
from loom.experiments import rose as ex
from loom.experiments import rose_steps as steps
from loom.rollout.rose.admission import AdmissionKind, Role, ServingSlo
from loom.rollout.rose.memory import MemoryConfig
from loom.sim.rollout.coserve import CoServeConfig, CoServingWorker, Resident, SwapConfig
from loom.sim.rollout.rose import RoseRollout

ONE_PREFILLER = [Role.PREFILL, Role.DECODE, Role.DECODE, Role.DECODE]
CALIBRATED_RPS = steps.serving_rate(WL, 4)  # the lent slice's serving rate for 4 lent GPUs


def watch_memory(r: RoseRollout, seen: dict[str, int]) -> None:
    """After every event: each lent worker's rollout KV fits its budget and what serving
    leaves of the pool; under preemptive sharing, serving waits only for its own pages."""

    def check() -> None:
        seen["events"] += 1
        for w in r.lent:
            held = w.used + w.idle_used
            assert held <= rollout_limit_tokens(w), (
                f"t={r.eng.now:.3f} worker {w.idx}: rollout holds {held} tokens, "
                f"limit {rollout_limit_tokens(w)} (serving {w.serving_pages} pages)"
            )
            assert w.used >= 0 and w.idle_used >= 0 and w.reserved >= 0
            if w.s_wait:
                seen["serving_waits"] += 1
                head = w.s_wait[0]
                pool = w.mem.cfg.pool_pages * w.s_tpp
                own = pool if w.cfg.preemptive else pool // 2
                assert w.s_tokens + head.kv_tokens > own, (
                    f"t={r.eng.now:.3f} worker {w.idx}: a serving request waits though "
                    f"serving's own pages would hold it"
                )

    hooks(r).append(check)


# ---- memory --------------------------------------------------------------------------------
@settings(max_examples=8, deadline=None)
@given(
    pool=st.integers(1_500, 6_000),
    prompt=st.integers(2_000, 24_000),
    output=st.integers(50, 2_000),
    every=st.sampled_from([0.5, 2.0, 5.0]),
    n_groups=st.integers(1, 2),
    preemptive=st.booleans(),
)
def test_rollout_pages_never_exceed_what_serving_leaves(
    pool: int, prompt: int, output: int, every: float, n_groups: int, preemptive: bool
) -> None:
    trajs = specs(n_groups)
    seen = {"serving_waits": 0, "events": 0}
    with pytest.MonkeyPatch.context() as mp:
        checked(mp)
        r = make_rollout(
            trajs,
            lent=lent_slice(4, pool_pages=pool, preemptive=preemptive),
            serving=trace(np.arange(0.0, 300.0, every), prompt, output),
        )
        watch_memory(r, seen)
        res = r.run()
    assert seen["events"] == res.events > 0
    assert res.output_tokens == output_tokens(trajs)


def test_big_serving_requests_cut_the_rollout_and_serving_never_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A few 22k-token serving requests decode at once, which the pool holds by itself, so
    no serving request may wait: every page serving needs comes from the rollout, whose
    turns are cut and re-routed."""
    trajs = specs(2)
    checked(monkeypatch)
    r = make_rollout(
        trajs,
        lent=lent_slice(4, pool_pages=3_000),
        serving=trace(np.arange(0.0, 300.0, 5.0), 20_000, 2_000),
    )
    seen = {"serving_waits": 0, "events": 0}
    watch_memory(r, seen)
    res = r.run()
    assert seen["serving_waits"] == 0 and seen["events"] == res.events
    assert res.cuts > 0 and res.aborts > 0, "the scenario must force memory cuts"
    assert res.output_tokens == output_tokens(trajs)


def test_the_static_partition_keeps_the_rollout_to_half_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trajs = specs(2)
    checked(monkeypatch)
    r = make_rollout(
        trajs,
        lent=lent_slice(4, pool_pages=3_000, preemptive=False),
        serving=trace(np.arange(0.0, 200.0, 1.0), 8_000, 500),
    )
    seen = {"serving_waits": 0, "events": 0}
    watch_memory(r, seen)
    peak = [0]
    hooks(r).append(lambda: peak.__setitem__(0, max([peak[0]] + [w.used for w in r.lent])))
    res = r.run()
    assert 0 < peak[0] <= 1_500 * r.lent[0].r_tpp
    assert res.cuts == 0, "a static partition never cuts"
    assert res.output_tokens == output_tokens(trajs)


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_leased_prefixes_expire_after_the_lease(
    monkeypatch: pytest.MonkeyPatch, prefix_cache: bool
) -> None:
    lease = 3.0
    trajs = specs(2)
    checked(monkeypatch)
    r = make_rollout(
        trajs, lent=lent_slice(4, lease_s=lease, prefix_cache=prefix_cache), dedicated=0
    )
    put: dict[tuple[int, int], float] = {}
    for w in r.lent:

        def record(traj, tokens, w=w, orig=w.put_idle):  # type: ignore[no-untyped-def]
            kept = orig(traj, tokens)
            if kept:
                put[(w.idx, traj.traj_id)] = r.eng.now
            return kept

        w.put_idle = record  # type: ignore[method-assign]

    def check() -> None:
        for w in r.lent:
            for t in w.idle:
                assert r.eng.now - put[(w.idx, t)] <= lease + 1e-9, f"prefix {t} outlived"

    hooks(r).append(check)
    res = r.run()
    assert res.output_tokens == output_tokens(trajs)
    assert bool(put) == prefix_cache, "turns between tools keep a prefix only with the cache"


# ---- admission -----------------------------------------------------------------------------
@settings(max_examples=6, deadline=None)
@given(
    rps=st.sampled_from([CALIBRATED_RPS, 8.0, 16.0]),
    seed=st.integers(0, 3),
    step=st.integers(0, 5),
)
def test_dual_slo_keeps_each_serving_tpot_within_the_slo(rps: float, seed: int, step: int) -> None:
    day = short_day(rps, seed=seed)
    alone = make_rollout((), lent=lent_slice(4), dedicated=0, serving=day, serving_horizon_s=600.0)
    assert alone.run().tpot_s.max() <= SLO.tpot_s, "serving alone must meet the SLO"
    # 32 trajectories and one dedicated worker of 16: the lent ones take the rest
    res = make_rollout(specs(2, step), lent=lent_slice(4), serving=day).run()
    assert len(res.tpot_s) > 0
    assert res.tpot_s.max() <= SLO.tpot_s + 1e-9
    assert res.lent_busy_s > 0, "the decoders must run rollout iterations beside serving"


def test_without_tpot_control_a_tight_tpot_slo_is_broken() -> None:
    """Teeth for the test above: the same co-serving without TPOT admission breaks a TPOT
    SLO that serving alone meets."""
    t_dec = SERVING_LAT.decode_step_time(1, 2_000)
    slo = ServingSlo(ttft_s=SLO.ttft_s, tpot_s=1.5 * t_dec)
    day = short_day(CALIBRATED_RPS, seed=0)
    free = make_rollout(
        specs(2), lent=lent_slice(4, admission=AdmissionKind.TTFT_ONLY, slo=slo), serving=day
    ).run()
    assert free.tpot_s.max() > slo.tpot_s
    held = make_rollout(specs(2), lent=lent_slice(4, slo=slo), serving=day).run()
    assert held.tpot_s.max() <= slo.tpot_s + 1e-9


@settings(max_examples=4, deadline=None)
@given(rps=st.sampled_from([CALIBRATED_RPS, 8.0, 16.0]), seed=st.integers(0, 3))
def test_an_arriving_prefill_waits_at_most_one_rollout_iteration(rps: float, seed: int) -> None:
    """One prefiller serves FCFS, so request i of the co-served run is request i of serving
    alone; under TTFT enforcement its TTFT exceeds serving alone's by at most the longest
    rollout iteration that ran on the prefiller."""
    day = short_day(rps, seed=seed)
    r = make_rollout(specs(2), lent=lent_slice(4, roles=ONE_PREFILLER), serving=day)
    pre = r.prefillers[0]
    iterations: list[float] = []

    def record(start, k, dt, growth, orig=pre._schedule_segment):  # type: ignore[no-untyped-def]
        iterations.append(dt)
        orig(start, k, dt, growth)

    pre._schedule_segment = record  # type: ignore[method-assign]
    res = r.run()
    assert iterations, "the prefiller must run rollout iterations"
    alone = make_rollout(
        (),
        lent=lent_slice(4, roles=ONE_PREFILLER),
        dedicated=0,
        serving=day,
        serving_horizon_s=res.makespan_s,
    ).run()
    co = np.asarray(pre.stats.ttft)
    n = min(len(co), len(alone.ttft_s))
    assert n > 100
    extra = co[:n] - alone.ttft_s[:n]
    assert extra.max() <= max(iterations) + 1e-9
    assert extra.min() >= -1e-9, "co-serving never makes a prefill faster"


def test_without_admission_control_the_ttft_tail_grows() -> None:
    """At the experiments' stress density (Fig. 9 at 3x), no admission control lets rollout
    iterations delay prefills; ROSE's admission does not."""
    day = short_day(ex.STRESS_DENSITY * CALIBRATED_RPS, seed=0, hours=1.0)
    p99 = {}
    for kind in (AdmissionKind.DUAL_SLO, AdmissionKind.NONE):
        res = make_rollout(specs(2), lent=lent_slice(4, admission=kind), serving=day).run()
        p99[kind] = float(np.percentile(res.ttft_s, 99))
    assert p99[AdmissionKind.NONE] > 1.2 * p99[AdmissionKind.DUAL_SLO], p99


# ---- stalls --------------------------------------------------------------------------------
def test_turns_on_a_decoder_without_tpot_slack_stall_and_finish_elsewhere() -> None:
    """Serving decodes without pause and its TPOT SLO leaves no room for a rollout
    iteration: the decoders' turns make no progress, are given back after 2 s without it
    (so a worker stalls at most once per 2 s), and finish elsewhere."""
    t_dec = SERVING_LAT.decode_step_time(1, 2_000)
    slo = ServingSlo(ttft_s=SLO.ttft_s, tpot_s=1.05 * t_dec)
    trajs = specs(2)
    r = make_rollout(
        trajs,
        lent=lent_slice(4, slo=slo),
        serving=trace(np.arange(0.0, 120.0, 0.5), 200, 4_000),
    )
    stalled: dict[int, list[float]] = {w.idx: [] for w in r.lent}
    for w in r.lent:

        def record(traj, worker, why, orig=w._on_abort):  # type: ignore[no-untyped-def]
            if why == "stalled" and r.eng.now not in stalled[worker.idx][-1:]:
                stalled[worker.idx].append(r.eng.now)
            orig(traj, worker, why)

        w._on_abort = record
    res = r.run()
    assert res.stalls > 0 and res.aborts >= res.stalls
    assert sum(map(len, stalled.values())) == res.stalls
    for times in stalled.values():
        assert all(t >= 2.0 for t in times[:1])
        assert all(np.diff(times) >= 2.0 - 1e-9)
    assert all(w.stalls == 0 for w in r.prefillers), "prefillers had TTFT slack"
    assert res.output_tokens == output_tokens(trajs)


# ---- configuration -------------------------------------------------------------------------
def _memory() -> MemoryConfig:
    return MemoryConfig(pool_pages=100, headroom_pages=10)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"role": Role.COLOCATED}, "PD-disaggregated"),
        ({"stall_s": 0.0}, "stall_s"),
        ({"stall_s": math.nan}, "stall_s"),
        ({"chunk_tokens": 0}, "chunk_tokens"),
    ],
)
def test_bad_coserve_config_raises(kwargs: dict[str, object], match: str) -> None:
    args = {"role": Role.DECODE, "slo": SLO, "memory": _memory(), **kwargs}
    with pytest.raises(ConfigError, match=match):
        CoServeConfig(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("admission", "chunk"),
    [
        (AdmissionKind.DUAL_SLO, 512),
        (AdmissionKind.TTFT_ONLY, 512),
        (AdmissionKind.TPOT_ONLY, 512),
        (AdmissionKind.NONE, 8192),
    ],
)
def test_rollout_chunk_is_512_only_where_an_slo_is_enforced(
    admission: AdmissionKind, chunk: int
) -> None:
    cfg = CoServeConfig(role=Role.PREFILL, slo=SLO, memory=_memory(), admission=admission)
    assert cfg.rollout_chunk == chunk
    mine = CoServeConfig(role=Role.PREFILL, slo=SLO, memory=_memory(), chunk_tokens=64)
    assert mine.rollout_chunk == 64


def test_lent_instances_are_coserving_workers_with_their_own_pages() -> None:
    r = make_rollout(specs(1), lent=lent_slice(4))
    assert [type(w) for w in r.workers[1:]] == [CoServingWorker] * 4
    assert len(r.prefillers) == 1 and len(r.decoders) == 3
    w = r.lent[0]
    # 2 MiB pages: 14 tokens of Qwen3-8B's KV, 36 of Qwen2.5-7B's
    assert (w.r_tpp, w.s_tpp) == (14, 36)


# ---- ServerlessLLM: swapping the models (Table 1's baseline) -----------------------------
SWAP = SwapConfig(serving_load_s=1.0, rollout_load_s=1.5, keep_alive_s=0.5)


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],  # checked() patches alike
)
@given(
    gaps=st.lists(st.floats(0.05, 8.0), min_size=5, max_size=40),
    output=st.integers(2, 400),
    seed=st.integers(0, 3),
)
def test_a_swapping_instance_holds_one_model_and_loses_nothing(
    monkeypatch: pytest.MonkeyPatch, gaps: list[float], output: int, seed: int
) -> None:
    checked(monkeypatch)
    trajs = specs(2, step=seed)
    r = make_rollout(
        trajs,
        lent=lent_slice(4, swap=SWAP, admission=AdmissionKind.NONE),
        serving=trace(np.cumsum(gaps), 300, output),
        cap=2,
    )

    def check() -> None:
        for w in r.lent:
            if w.resident != Resident.ROLLOUT:  # the rollout model is not there
                assert not w.running and w.used + w.idle_used == 0, w.resident
                assert not w.activated
            if w.resident != Resident.SERVING:  # nor is the serving model
                assert r.eng.now >= w._s_busy_until and not math.isfinite(w._cycle)

    hooks(r).append(check)
    res = r.run()
    assert res.output_tokens == output_tokens(trajs)  # evicted turns finished elsewhere
    assert len(res.ttft_s) == len(gaps)  # every serving request served


def test_a_request_that_evicts_the_rollout_waits_for_the_serving_model() -> None:
    trajs = specs(2)
    r = make_rollout(
        trajs,
        lent=lent_slice(4, swap=SWAP, admission=AdmissionKind.NONE),
        serving=trace([0.0, 40.0, 40.2], 300, 50),
        cap=2,
    )
    res = r.run()
    assert res.lent_busy_s > 0  # the rollout ran there between the requests
    evictions = sum(w.swaps for w in r.lent)
    assert evictions >= 1 and res.aborts >= 1
    assert res.ttft_s.max() >= SWAP.serving_load_s  # it waited for its model
    assert res.output_tokens == output_tokens(trajs)


def test_swapping_with_serving_never_idle_for_the_keep_alive_never_lends() -> None:
    trajs = specs(1)
    r = make_rollout(
        trajs,
        lent=lent_slice(4, swap=SwapConfig(serving_load_s=1.0, rollout_load_s=1.0)),
        serving=trace(np.arange(0.0, 2_000.0, 0.1), 300, 20),  # no instance idles 1 s
        cap=2,
    )
    res = r.run()
    assert res.lent_busy_s == 0 and all(w.swaps == 0 for w in r.lent)
    assert res.output_tokens == output_tokens(trajs)
