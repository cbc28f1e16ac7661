"""Length predictors are causal in the step count, shaped one value per turn, deterministic, and
the progressive one beats prompt-only baselines; the Fig. 13 metrics behave on known cases."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom.core.errors import ConfigError
from loom.core.trajectory import TrajectorySpec, TurnSpec, WorkloadKind
from loom.rollout.heddle.predictor import (
    STEP_FEATURE_NAMES,
    BoostingConfig,
    LengthPredictor,
    ProgressivePredictor,
    PromptHistoryPredictor,
    PromptModelPredictor,
    long_tail_recall,
    pearson,
    step_features,
    steps_features,
)
from loom.sim.workloads.agentic import AgenticWorkload

# ---------------------------------------------------------------------------------------------
# Factories

Turn = tuple[int, int, float]  # (input tokens, output tokens, tool latency)


def make_spec(
    turns: Sequence[Turn],
    *,
    traj_id: int = 0,
    prompt_id: int = 0,
    prompt_features: tuple[float, ...] = (600.0, 1.0),
) -> TrajectorySpec:
    last = len(turns) - 1
    return TrajectorySpec(
        traj_id=traj_id,
        prompt_id=prompt_id,
        sample_idx=0,
        workload=WorkloadKind.CODING,
        turns=tuple(
            TurnSpec(input_tokens=i, output_tokens=o, tool_latency_s=None if j == last else lat)
            for j, (i, o, lat) in enumerate(turns)
        ),
        prompt_features=prompt_features,
    )


def coding(num_prompts: int = 30, seed: int = 0) -> AgenticWorkload:
    return AgenticWorkload(
        kind=WorkloadKind.CODING, model="qwen3-14b", num_prompts=num_prompts, prompt_seed=seed
    )


SMALL = BoostingConfig(max_iter=40, random_state=0)


@pytest.fixture(scope="module")
def history() -> list[TrajectorySpec]:
    w = coding()
    return w.sample(0) + w.sample(1)


@pytest.fixture(scope="module")
def batch() -> list[TrajectorySpec]:
    return coding().sample(7)


@pytest.fixture(scope="module")
def fitted(history: list[TrajectorySpec]) -> dict[str, LengthPredictor]:
    return {
        "progressive": ProgressivePredictor(SMALL).fit(history),
        "history": PromptHistoryPredictor().fit(history),
        "model": PromptModelPredictor(SMALL).fit(history),
    }


PREDICTORS = ["progressive", "history", "model"]

# ---------------------------------------------------------------------------------------------
# Causality

turn_st = st.tuples(
    st.integers(0, 4_000), st.integers(1, 6_000), st.floats(0.0, 30.0, allow_nan=False)
)
turns_st = st.lists(turn_st, min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(prefix=turns_st, tail=turns_st, other_tail=turns_st, cut=st.integers(0, 11))
@pytest.mark.parametrize("name", PREDICTORS)
def test_prediction_after_k_steps_ignores_turns_k_and_later(
    fitted: dict[str, LengthPredictor],
    name: str,
    prefix: list[Turn],
    tail: list[Turn],
    other_tail: list[Turn],
    cut: int,
) -> None:
    k = min(cut, len(prefix))
    a = make_spec(prefix[:k] + tail)
    b = make_spec(prefix[:k] + other_tail)  # another turn k, future, total and turn count
    table_a, table_b = fitted[name].predict_steps([a, b])
    assert table_a[: k + 1] == table_b[: k + 1]


@settings(max_examples=60, deadline=None)
@given(prefix=turns_st, tail=turns_st, other_tail=turns_st, cut=st.integers(0, 11))
def test_step_features_read_only_the_past(
    prefix: list[Turn], tail: list[Turn], other_tail: list[Turn], cut: int
) -> None:
    k = min(cut, len(prefix))
    a = step_features(make_spec(prefix[:k] + tail), k)
    b = step_features(make_spec(prefix[:k] + other_tail), k)
    np.testing.assert_array_equal(a, b)


def test_vectorised_features_equal_the_per_step_function(batch: list[TrajectorySpec]) -> None:
    rows = steps_features(batch)
    expected = np.array([step_features(s, k) for s in batch for k in range(s.num_turns)])
    np.testing.assert_array_equal(rows.features, expected)  # NaN == NaN here
    assert rows.features.shape[1] == 2 + len(STEP_FEATURE_NAMES)
    assert rows.steps_done.tolist() == [k for s in batch for k in range(s.num_turns)]


def test_step_features_of_a_known_trajectory() -> None:
    spec = make_spec([(600, 100, 1.0), (50, 20, 2.0), (70, 30, 0.0)])
    np.testing.assert_array_equal(
        step_features(spec, 2), [600.0, 1.0, 2, 120, 770, 100, 20, 60, 50, 3.0]
    )
    k0 = step_features(spec, 0)
    assert k0[2:4].tolist() == [0, 0] and np.isnan(k0[5:9]).all()
    with pytest.raises(ConfigError, match="k must be in"):
        step_features(spec, 3)


# ---------------------------------------------------------------------------------------------
# Shapes and determinism


@pytest.mark.parametrize("name", PREDICTORS)
def test_one_finite_prediction_per_turn_at_least_the_tokens_so_far(
    fitted: dict[str, LengthPredictor], batch: list[TrajectorySpec], name: str
) -> None:
    tables = fitted[name].predict_steps(batch)
    assert len(tables) == len(batch)
    for spec, row in zip(batch, tables, strict=True):
        assert len(row) == spec.num_turns
        assert all(math.isfinite(v) and v >= 0 for v in row)
    assert fitted[name].predict_steps([]) == []


def test_progressive_prediction_never_below_what_was_generated(
    fitted: dict[str, LengthPredictor], batch: list[TrajectorySpec]
) -> None:
    for spec, row in zip(batch, fitted["progressive"].predict_steps(batch), strict=True):
        done = np.cumsum([0] + [t.output_tokens for t in spec.turns[:-1]])
        assert (np.array(row) >= done).all()


def test_progressive_last_step_alone_equals_the_full_table(
    fitted: dict[str, LengthPredictor], batch: list[TrajectorySpec]
) -> None:
    """The router asks only for a trajectory's latest step: the same answer as the table."""
    progressive = fitted["progressive"]
    assert isinstance(progressive, ProgressivePredictor)
    tables = progressive.predict_steps(batch)
    assert progressive.predict_last(batch) == [row[-1] for row in tables]
    assert progressive.predict_last(batch[3:5]) == [row[-1] for row in tables[3:5]]
    assert progressive.predict_last([]) == []


def test_prompt_only_predictors_are_constant_over_steps(
    fitted: dict[str, LengthPredictor], batch: list[TrajectorySpec]
) -> None:
    for name in ("history", "model"):
        assert all(len(set(row)) == 1 for row in fitted[name].predict_steps(batch))


def test_history_predictor_uses_the_prompt_mean_or_the_global_mean() -> None:
    history = [
        make_spec([(10, 100, 0.0)], prompt_id=0),
        make_spec([(10, 300, 0.0)], prompt_id=0),
        make_spec([(10, 800, 0.0)], prompt_id=1),
    ]
    pred = PromptHistoryPredictor().fit(history)
    seen = make_spec([(10, 5, 1.0), (10, 5, 0.0)], prompt_id=0)
    unseen = make_spec([(10, 5, 0.0)], prompt_id=9)
    assert pred.predict_steps([seen, unseen]) == [(200.0, 200.0), (400.0,)]


def test_progressive_fits_a_history_of_short_trajectories_without_features() -> None:
    """Features no trajectory reaches (all NaN in training) are ignored, not fatal."""
    history = [
        make_spec([(600, 100 + 37 * i, 1.0), (50, 80, 0.0)], traj_id=i, prompt_features=())
        for i in range(30)
    ]
    pred = ProgressivePredictor(SMALL).fit(history)
    longer = make_spec([(600, 100, 1.0), (50, 80, 1.0), (40, 60, 1.0), (5, 9, 0.0)])
    batch = [*history[:3], replace(longer, prompt_features=())]
    for spec, row in zip(batch, pred.predict_steps(batch), strict=True):
        assert len(row) == spec.num_turns and all(math.isfinite(v) for v in row)


def test_same_random_state_same_predictions(
    history: list[TrajectorySpec], batch: list[TrajectorySpec]
) -> None:
    first = ProgressivePredictor(SMALL).fit(history).predict_steps(batch)
    again = ProgressivePredictor(SMALL).fit(list(history)).predict_steps(batch)
    assert first == again
    model = PromptModelPredictor(SMALL)
    assert model.fit(history).predict_steps(batch) == model.fit(history).predict_steps(batch)


# ---------------------------------------------------------------------------------------------
# Metrics


def test_perfect_predictor_scores_one() -> None:
    actual = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0, 4.0, 6.0, 10.0]
    assert long_tail_recall(actual, actual) == 1.0
    assert long_tail_recall([2 * a + 1 for a in actual], actual, quantile=0.5) == 1.0
    assert pearson(actual, actual) == pytest.approx(1.0)


def test_reversed_predictor_recalls_nothing() -> None:
    actual = np.arange(20.0)
    assert long_tail_recall(-actual, actual) == 0.0
    assert long_tail_recall(-actual, actual, quantile=0.5) == 0.0
    assert pearson(-actual, actual) == pytest.approx(-1.0)


def test_recall_count_and_ties() -> None:
    actual = np.arange(1600.0)
    predicted = actual.copy()
    predicted[-160] = -1.0  # push one true top-10% item out; the 161st longest comes in
    assert long_tail_recall(predicted, actual) == pytest.approx(159 / 160)
    # All predictions tie: the lowest indices count as predicted-longest.
    assert long_tail_recall([1.0] * 4, [0.0, 0.0, 5.0, 9.0], quantile=0.5) == 0.0
    assert long_tail_recall([1.0] * 4, [9.0, 5.0, 0.0, 0.0], quantile=0.5) == 1.0
    assert long_tail_recall([3.0], [4.0]) == 1.0  # at least one trajectory counts


def test_pearson_is_nan_without_warning_when_undefined() -> None:
    assert math.isnan(pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    assert math.isnan(pearson([1.0, 2.0, 3.0], [4.0, 4.0, 4.0]))
    assert math.isnan(pearson([1.0], [2.0]))


def test_metrics_reject_bad_input() -> None:
    with pytest.raises(ConfigError, match="equal length"):
        long_tail_recall([1.0, 2.0], [1.0])
    with pytest.raises(ConfigError, match="non-empty"):
        pearson([], [])
    with pytest.raises(ConfigError, match="quantile"):
        long_tail_recall([1.0], [1.0], quantile=1.0)
    with pytest.raises(ConfigError, match="finite"):
        pearson([1.0, math.nan], [1.0, 2.0])


# ---------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize(
    "make",
    [
        lambda: ProgressivePredictor(),
        lambda: PromptHistoryPredictor(),
        lambda: PromptModelPredictor(),
    ],
)
def test_empty_history_is_refused(make: object) -> None:
    predictor = make()  # type: ignore[operator]
    with pytest.raises(ValueError, match="at least one historical trajectory"):
        predictor.fit([])
    with pytest.raises(RuntimeError, match="not fitted"):
        predictor.predict_steps([make_spec([(10, 5, 0.0)])])


def test_prompt_feature_width_must_match(fitted: dict[str, LengthPredictor]) -> None:
    narrow = make_spec([(10, 5, 0.0)], prompt_features=(600.0,))
    for name in ("progressive", "model"):
        with pytest.raises(ConfigError, match="prompt features"):
            fitted[name].predict_steps([narrow])
    with pytest.raises(ConfigError, match="disagree"):
        steps_features([narrow, make_spec([(10, 5, 0.0)])])
    with pytest.raises(ConfigError, match="needs prompt features"):
        PromptModelPredictor().fit([make_spec([(10, 5, 0.0)], prompt_features=())])


def test_boosting_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="max_iter"):
        BoostingConfig(max_iter=0)
    with pytest.raises(ConfigError, match="learning_rate"):
        BoostingConfig(learning_rate=0.0)
    with pytest.raises(ConfigError, match="threads"):
        BoostingConfig(threads=0)
