"""Heddle Fig. 13: long-tail recall and Pearson correlation of the progressive predictor
against the prompt-only baselines, trained on earlier epochs of a simulated workload."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from loom.core.errors import ConfigError
from loom.core.trajectory import WorkloadKind
from loom.rollout.heddle.predictor import (
    BoostingConfig,
    ProgressivePredictor,
    PromptHistoryPredictor,
    PromptModelPredictor,
    long_tail_recall,
    pearson,
)
from loom.sim.workloads.agentic import AgenticWorkload

__all__ = ["PredictionPolicy", "evaluate_predictors"]

FloatArray = npt.NDArray[np.float64]


class PredictionPolicy(StrEnum):
    """The predictors compared in Heddle Fig. 13."""

    HEDDLE_1 = "heddle-1"  # progressive, after the first step
    HEDDLE_2 = "heddle-2"  # progressive, after the second step
    HISTORY = "history"  # per-prompt historical mean
    MODEL = "model"  # regressor on prompt features


def _at_step(table: Sequence[tuple[float, ...]], k: int) -> FloatArray:
    """The prediction after `k` steps, or the last one for trajectories with fewer turns."""
    return np.array([row[min(k, len(row) - 1)] for row in table], dtype=np.float64)


def evaluate_predictors(
    workload: AgenticWorkload,
    history_epochs: Sequence[int] = (0, 1, 2),
    eval_epoch: int = 10,
    *,
    quantile: float = 0.9,
    config: BoostingConfig | None = None,
) -> list[dict[str, object]]:
    """Fig. 13: train on `history_epochs`, score each policy on `eval_epoch` against actual
    total output tokens. One row per policy: workload, policy, recall, pearson."""
    if eval_epoch in history_epochs:
        raise ConfigError(f"eval_epoch {eval_epoch} is also a history epoch {history_epochs}")
    history = [s for e in history_epochs for s in workload.sample(e)]
    batch = workload.sample(eval_epoch)
    progressive = ProgressivePredictor(config).fit(history).predict_steps(batch)
    by_policy: dict[PredictionPolicy, FloatArray] = {
        PredictionPolicy.HEDDLE_1: _at_step(progressive, 1),
        PredictionPolicy.HEDDLE_2: _at_step(progressive, 2),
        PredictionPolicy.HISTORY: _at_step(
            PromptHistoryPredictor().fit(history).predict_steps(batch), 0
        ),
        PredictionPolicy.MODEL: _at_step(
            PromptModelPredictor(config).fit(history).predict_steps(batch), 0
        ),
    }
    actual = np.array([s.output_tokens for s in batch], dtype=np.float64)
    return [
        {
            "workload": str(WorkloadKind(workload.kind)),
            "policy": policy.value,
            "recall": long_tail_recall(pred, actual, quantile),
            "pearson": pearson(pred, actual),
        }
        for policy, pred in by_policy.items()
    ]
