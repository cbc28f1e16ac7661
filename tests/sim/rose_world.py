"""Tiny ROSE worlds for the co-serving tests: a few trajectories of the 8B workload, a few lent
instances (optionally on a small page pool), a short serving trace, and an engine that runs
one event at a time and calls hooks after each."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

import loom.sim.rollout.rose as rose_sim
from loom.core.trajectory import TrajectorySpec, TurnSpec
from loom.experiments import rose_steps as steps
from loom.perf.latency import RooflineLatencyModel
from loom.perf.specs import model_spec
from loom.rollout.rose.admission import AdmissionKind, Role, ServingSlo
from loom.rollout.rose.memory import MemorySharing
from loom.rollout.rose.scheduler import ElasticRouter, RoutingKind
from loom.sim.engine import Engine
from loom.sim.rollout.coserve import CoServeConfig, CoServingWorker, SwapConfig
from loom.sim.rollout.rose import LentInstance, RoseRollout
from loom.sim.workloads.rose import ROSE_WORKLOADS
from loom.sim.workloads.serving import ServingTrace, synthetic_day

WL = ROSE_WORKLOADS["8b"]
SLO = ServingSlo(ttft_s=WL.slo_ttft_s, tpot_s=WL.slo_tpot_s)
ROLLOUT_LAT = RooflineLatencyModel(steps.GPU, WL.model, tp=1)
SERVING_LAT = RooflineLatencyModel(steps.GPU, WL.serving_model, tp=1)


def specs(n_groups: int = 1, step: int = 0) -> list[TrajectorySpec]:
    return WL.sample(step, n_groups=n_groups)


def spec(traj_id: int, *turns: tuple[int, int], tool_s: float = 0.5) -> TrajectorySpec:
    """A hand-made trajectory of `(input, output)` turns with `tool_s` between them."""
    last = len(turns) - 1
    return TrajectorySpec(
        traj_id=traj_id,
        prompt_id=traj_id,
        sample_idx=0,
        workload=None,
        turns=tuple(
            TurnSpec(input_tokens=i, output_tokens=o, tool_latency_s=None if k == last else tool_s)
            for k, (i, o) in enumerate(turns)
        ),
    )


def lent_slice(
    n: int,
    *,
    admission: AdmissionKind = AdmissionKind.DUAL_SLO,
    pool_pages: int | None = None,
    headroom_pages: int | None = None,
    preemptive: bool = True,
    prefix_cache: bool = True,
    lease_s: float = 10.0,
    slo: ServingSlo = SLO,
    roles: Sequence[Role] | None = None,
    swap: SwapConfig | None = None,
) -> list[LentInstance]:
    """`n` lent TP1 instances, 1 prefiller : 3 decoders unless `roles` says otherwise, on the
    real H800 pool or on `pool_pages` (headroom a fifth of it unless given)."""
    mem = steps._memory(WL.model, WL.serving_model, 1, lease_s)
    if pool_pages is not None:
        head = pool_pages // 5 if headroom_pages is None else headroom_pages
        mem = replace(mem, pool_pages=pool_pages, headroom_pages=head)
    roles = roles or [Role.PREFILL if i % 4 == 0 else Role.DECODE for i in range(n)]
    return [
        LentInstance(
            config=CoServeConfig(
                role=role,
                slo=slo,
                admission=admission,
                memory=mem,
                preemptive=preemptive,
                prefix_cache=prefix_cache,
                swap=swap,
            ),
            memory=MemorySharing(mem),
            tp=1,
        )
        for role in roles
    ]


def make_rollout(
    trajectories: Sequence[TrajectorySpec],
    *,
    lent: Sequence[LentInstance] = (),
    dedicated: int = 1,
    cap: int = 16,
    routing: RoutingKind = RoutingKind.ROSE,
    **kw: Any,
) -> RoseRollout:
    rm, sm = model_spec(WL.model), model_spec(WL.serving_model)
    return RoseRollout(
        trajectories,
        router=ElasticRouter(routing, cap_per_gpu=cap),
        dedicated_tp=[1] * dedicated,
        rollout_latency=lambda tp: RooflineLatencyModel(steps.GPU, WL.model, tp=tp),
        serving_latency=lambda tp: RooflineLatencyModel(steps.GPU, WL.serving_model, tp=tp),
        rollout_kv_bytes=rm.kv_bytes_per_token,
        serving_kv_bytes=sm.kv_bytes_per_token,
        lent=lent,
        cap_per_gpu=cap,
        **kw,
    )


def trace(arrivals: Sequence[float], prompt: int | Sequence[int], output: int | Sequence[int]):
    """A hand-made serving trace."""
    arr = np.asarray(arrivals, dtype=np.float64)
    return ServingTrace(
        name="hand-made",
        source="test",
        arrival_s=arr,
        prompt_tokens=np.broadcast_to(np.asarray(prompt, dtype=np.int64), arr.shape).copy(),
        output_tokens=np.broadcast_to(np.asarray(output, dtype=np.int64), arr.shape).copy(),
        duration_s=float(arr[-1]) if len(arr) else 0.0,
    )


def short_day(rps: float, seed: int = 0, hours: float = 0.5) -> ServingTrace:
    """The synthetic serving day's shape over a short span, at `rps` requests/s."""
    return synthetic_day(mean_rps=rps, hours=hours, seed=seed)


def output_tokens(trajectories: Sequence[TrajectorySpec]) -> int:
    return sum(t.output_tokens for t in trajectories)


class CheckedEngine(Engine):
    """An engine that runs one event at a time and calls each of `hooks` after it."""

    __slots__ = ("hooks",)

    def __init__(self, start: float = 0.0) -> None:
        super().__init__(start)
        self.hooks: list[Callable[[], None]] = []

    def run(self, until: float | None = None, max_events: int | None = None) -> int:
        assert max_events is None, "the checked engine counts its own events"
        total = 0
        while True:
            ran = super().run(until=until, max_events=1)
            total += ran
            if not ran:
                return total
            for hook in self.hooks:
                hook()
            if self._stopped:
                return total


def checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """RoseRollouts built from now on run on a `CheckedEngine`."""
    monkeypatch.setattr(rose_sim, "Engine", CheckedEngine)


def hooks(r: RoseRollout) -> list[Callable[[], None]]:
    assert isinstance(r.eng, CheckedEngine), "call checked(monkeypatch) before make_rollout"
    return r.eng.hooks


def rollout_limit_tokens(w: CoServingWorker) -> int:
    """KV tokens the rollout may hold on `w` now: its budget, and what serving leaves of the
    pool (preemptive sharing); half the pool under the static partition."""
    pool = w.mem.cfg.pool_pages
    if not w.cfg.preemptive:
        return pool // 2 * w.r_tpp
    return max(0, min(w.mem.budget, pool - w.serving_pages)) * w.r_tpp
