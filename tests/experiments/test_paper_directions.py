"""Each paper's direction (who beats whom), at a seed of its own that no figure was tuned on,
on a workload small enough for two cores: a finding of a reproduction cannot flip unnoticed."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from loom.actions.policy import ActionPolicyKind as P
from loom.core.trajectory import WorkloadKind
from loom.experiments import plexrl, rose
from loom.experiments.heddle import HEDDLE, HeddleScale, Scenario, baseline_systems
from loom.experiments.tangram_cases import REWARD_TRACE, Case, run_case
from loom.rollout.rose.admission import AdmissionKind
from loom.sim.workloads.rose import ROSE_WORKLOADS

SEED = 23  # none of the reproductions' defaults (1) nor the audit's seed (7)


def test_rose_fig9_dual_slo_holds_the_tpot_tail_that_ttft_only_loses() -> None:
    """ROSE Fig. 9: Dual-SLO's P99 TPOT is below TTFT-only's (paper: 76.3% lower). Without
    Eq. 2 nothing hands a decoder back to its serving decodes while the rollout has work."""
    # 64 trajectories on one dedicated GPU and four lent ones: the lent decoders co-serve
    wl = replace(ROSE_WORKLOADS["8b"], batch=64, rollout_gpus=1, max_lent_gpus=4)
    p99 = {}
    for kind in (AdmissionKind.DUAL_SLO, AdmissionKind.TTFT_ONLY):
        run = rose.train(wl, replace(rose.ROSE, admission=kind), rose.Algo.GRPO, 1, seed=SEED)
        _, tpot = run.serving()
        assert len(tpot) > 100
        p99[kind] = float(np.percentile(tpot, 99))
    assert p99[AdmissionKind.DUAL_SLO] <= wl.slo_tpot_s
    assert p99[AdmissionKind.DUAL_SLO] < p99[AdmissionKind.TTFT_ONLY], p99


ROSE_SEEDS = (3, 11, 29)  # held out: the docs quote seeds 1 and 7, the issue seed 23


@pytest.fixture(scope="module")
def rose_fig14() -> dict[int, dict[int, dict]]:
    """Fig. 14's rows (quick scale) at each held-out seed, by seed and lent GPUs."""
    scale = rose.RoseScale.for_run(quick=True)
    return {
        seed: {
            r["lent_gpus"]: r
            for _, thunk in rose.fig14_tasks(scale, seed)
            for r in thunk()
            if r["experiment"] == "fig14"
        }
        for seed in ROSE_SEEDS
    }


def test_rose_fig14_no_number_of_lent_gpus_beats_the_slowest_trajectory_alone(
    rose_fig14: dict[int, dict[int, dict]],
) -> None:
    """ROSE App. E / Fig. 14: lent GPUs can end a step no sooner than its slowest trajectory
    decodes alone (`speedup_bound`); every measured speedup is within it, and 16 lent GPUs
    shorten the step at every seed. The bound is below the paper's 1.69x at these seeds
    (docs/differences.md says why)."""
    for seed, rows in rose_fig14.items():
        bound = rows[0]["speedup_bound"]
        assert 1.0 < bound < rose.PAPER[("fig14", "8b", 16)], (seed, bound)
        for n, r in rows.items():
            assert r["speedup"] <= bound, (seed, n, r["speedup"], bound)
        assert rows[16]["rollout_time_s"] < rows[0]["rollout_time_s"], seed


@pytest.mark.xfail(
    strict=True,
    reason="the model's step ends with its longest trajectories on the dedicated GPUs, which "
    "§4.3's cap keeps full: 4 → 8 lent GPUs lengthens it at some seeds, and 16 give 1.05-1.16x "
    "of a 1.52-1.58x bound (docs/differences.md, ROSE Fig. 14)",
)
def test_rose_fig14_each_step_of_lent_gpus_shortens_the_rollout_as_the_paper_says(
    rose_fig14: dict[int, dict[int, dict]],
) -> None:
    """The paper's claim as stated: rollout time falls with 4, 8 and 16 lent GPUs, and 16
    give at least 1.45x (its 1.69x within 15%)."""
    for seed, rows in rose_fig14.items():
        times = [rows[n]["rollout_time_s"] for n in (0, 4, 8, 16)]
        assert times == sorted(times, reverse=True), (seed, times)
        assert rows[16]["speedup"] >= 1.45, (seed, rows[16]["speedup"])


@pytest.mark.parametrize("key", ["8b", "32b"])
def test_rose_fig7_rose_beats_roll_grpo(key: str) -> None:
    """ROSE Fig. 7a: with its lent GPUs, ROSE's throughput beats ROLL's under GRPO (paper
    1.31x on 8B, 1.46x on 32B), at every held-out seed."""
    wl = ROSE_WORKLOADS[key]
    for seed in ROSE_SEEDS:
        roll = rose.train(wl, rose.ROLL, rose.Algo.GRPO, 2, seed)
        ours = rose.train(wl, rose.ROSE, rose.Algo.GRPO, 2, seed)
        assert ours.mean_throughput() > roll.mean_throughput(), (key, seed)


def test_plexrl_fig8_spread_backfill_drains_first_and_delays_least() -> None:
    """PlexRL Fig. 8: every sharing policy drains the trace before Isolated, Spread+Backfill
    no later than the others (paper 0.56x Isolated), with the lowest median queueing delay
    (ties allowed). Pack against Spread is not checked: the model does not reproduce the
    paper's order (docs/differences.md)."""
    rows = {
        r["policy"]: r
        for r in plexrl.fig8_records(SEED, jobs=40, groups=4, load=plexrl.FIG8_LOAD)
        if r["experiment"] == "fig8"
    }
    drain = {k: r["drain_vs_isolated"] for k, r in rows.items()}
    assert drain["isolated"] == 1.0
    assert max(drain["pack"], drain["spread"]) < 1.0, drain
    # the drain ends with the last departure, which backfilling may leave where it was
    assert drain["spread_backfill"] <= min(drain["pack"], drain["spread"]), drain
    p50 = {k: r["queue_delay_p50"] for k, r in rows.items()}
    assert p50["spread_backfill"] == min(p50.values()) < p50["isolated"], p50


def _act(workload: str, policy: P) -> float:
    case = Case(workload=workload, policy=policy, batch_size=64, seed=SEED, cpu_nodes=1)
    return run_case(case).avg_act_s()


def test_tangram_beats_kubernetes_on_coding_and_fixed_dop_on_the_reward_trace() -> None:
    """ARL-Tangram §6.2 and Fig. 9: a lower average ACT than a pod per trajectory on coding
    (paper 4.3x) and than fixed DoP=4 and DoP=16 on the reward trace (paper 2.0x, 3.0x)."""
    assert _act("coding", P.TANGRAM) < _act("coding", P.K8S)
    tangram = _act(REWARD_TRACE, P.TANGRAM)
    assert tangram < _act(REWARD_TRACE, P.DOP4)
    assert tangram < _act(REWARD_TRACE, P.DOP16)


@pytest.mark.parametrize("kind", [WorkloadKind.CODING, WorkloadKind.SEARCH, WorkloadKind.MATH])
def test_heddle_fig12_finishes_the_batch_before_verl_and_slime(kind: WorkloadKind) -> None:
    """Heddle Fig. 12: Heddle's rollout beats verl, verl* and slime on every workload (paper
    1.7-2.6x). Fig. 14's and Fig. 15's ablations are not checked here: under §5.3's rule the
    model does not reproduce them (docs/differences.md)."""
    scale = HeddleScale(gpus=8, per_worker_batch=8, history_epochs=(0, 1))
    scn = Scenario(kind=kind, model="qwen3-8b", scale=scale, seed=SEED)
    heddle = scn.simulate(HEDDLE).makespan_s
    for name, spec in baseline_systems("qwen3-8b").items():
        assert heddle < scn.simulate(spec).makespan_s, name
