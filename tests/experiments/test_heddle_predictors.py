"""Heddle Fig. 13: the progressive predictor against the prompt-only baselines."""

from __future__ import annotations

import pytest

from loom.core.errors import ConfigError
from loom.core.trajectory import WorkloadKind
from loom.experiments.heddle_predictors import evaluate_predictors
from loom.sim.workloads.agentic import AgenticWorkload


def coding(num_prompts: int) -> AgenticWorkload:
    return AgenticWorkload(kind=WorkloadKind.CODING, model="qwen3-14b", num_prompts=num_prompts)


def test_progressive_beats_prompt_only_baselines_on_coding() -> None:
    rows = evaluate_predictors(coding(num_prompts=40), history_epochs=(0, 1), eval_epoch=10)
    by = {r["policy"]: r for r in rows}
    assert set(by) == {"heddle-1", "heddle-2", "history", "model"}
    for metric in ("recall", "pearson"):
        baseline = max(float(by[p][metric]) for p in ("history", "model"))  # type: ignore[arg-type]
        for heddle in ("heddle-1", "heddle-2"):
            assert float(by[heddle][metric]) > baseline + 0.1, (metric, by)  # type: ignore[arg-type]
    assert float(by["heddle-2"]["pearson"]) >= float(by["heddle-1"]["pearson"])  # type: ignore[arg-type]


def test_evaluation_refuses_to_score_on_its_training_epoch() -> None:
    with pytest.raises(ConfigError, match="also a history epoch"):
        evaluate_predictors(coding(num_prompts=2), history_epochs=(0, 1), eval_epoch=1)
