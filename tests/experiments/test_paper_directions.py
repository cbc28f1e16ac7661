"""Each paper's direction (who beats whom), at a seed of its own that no figure was tuned on,
on a workload small enough for two cores: a finding of a reproduction cannot flip unnoticed."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from loom.experiments import rose
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
