"""Trajectory length prediction (Heddle §4.1, §7.2): after each completed step, estimate a
trajectory's total output tokens from its prompt and the context it has generated so far.

A `LengthPredictor` answers for every step count at once: ``predict_steps(trajs)[i][k]`` is the
predicted total after ``k`` completed steps, ``k = 0 .. num_turns - 1``. The table may use only
the prompt features and turns ``[0, k)``, so precomputing it in one vectorised call is the same
as calling a runtime predictor after each step. `ProgressivePredictor` is Heddle's predictor
with gradient-boosted trees in place of the fine-tuned Qwen-0.6B regressor; `step_features` is
the only place that reads a trajectory, so a text-based model can replace it behind the same
protocol. `PromptHistoryPredictor` and `PromptModelPredictor` are the prompt-only baselines of
Fig. 13 (`loom.experiments.heddle_predictors` reproduces its rows).
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING, NamedTuple, Protocol, Self

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    # NOTE: imported where a model is first fitted: a router that serves (and any process that
    # only reads its settings) starts without scikit-learn and SciPy, a second of imports
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import ThreadpoolController

from loom.core.errors import ConfigError
from loom.core.trajectory import TrajectorySpec, WorkloadKind

__all__ = [
    "STEP_FEATURE_NAMES",
    "BoostingConfig",
    "LengthPredictor",
    "ProgressivePredictor",
    "PromptHistoryPredictor",
    "PromptModelPredictor",
    "StepRows",
    "long_tail_recall",
    "pearson",
    "step_features",
    "steps_features",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# NOTE: the tool output returned after step k - 1 is stored as turns[k].input_tokens, so the
# causal contract (turns [0, k) only) excludes it; "last_tool_output" is the one step k - 1 read.
STEP_FEATURE_NAMES: tuple[str, ...] = (
    "steps_done",  # k
    "generated",  # output tokens of turns [0, k)
    "context",  # input + output tokens of turns [0, k)
    "plan_output",  # output of the first step; NaN before it completes
    "last_output",  # output of step k - 1; NaN for k = 0
    "mean_output",  # generated / k; NaN for k = 0
    "last_tool_output",  # tool output fed into step k - 1; NaN for k < 2
    "tool_latency",  # total tool latency of turns [0, k)
)
"""Context features after `k` steps; each row is prefixed by the trajectory's prompt features."""


class LengthPredictor(Protocol):
    """Predicts total output tokens of trajectories after each number of completed steps."""

    def fit(self, history: Sequence[TrajectorySpec]) -> Self:
        """Learn from finished trajectories; raises `ConfigError` (a ValueError) if empty."""
        ...

    def predict_steps(self, trajs: Sequence[TrajectorySpec]) -> list[tuple[float, ...]]:
        """Per trajectory, one predicted total per k = 0 .. num_turns - 1 (causal in k)."""
        ...


@dataclass(frozen=True, kw_only=True)
class BoostingConfig:
    """Hyper-parameters of the gradient-boosted regressors (kept small: training is online)."""

    max_iter: int = field(default=100, metadata={"help": "boosting rounds"})
    learning_rate: float = field(default=0.1, metadata={"help": "shrinkage per round"})
    max_leaf_nodes: int = field(default=31, metadata={"help": "leaves per tree"})
    min_samples_leaf: int = field(default=20, metadata={"help": "minimum rows per leaf"})
    l2_regularization: float = field(default=0.0, metadata={"help": "L2 penalty on leaves"})
    random_state: int = field(default=0, metadata={"help": "seed; fits are deterministic"})
    # NOTE: one thread by default. The tables are small (~10^4 rows), and on small shared
    # machines OpenMP barriers in scikit-learn's boosting sporadically stall for seconds
    # (a 0.2 s fit took 6-15 s on 2 vCPUs); a single thread is both fast and steady.
    threads: int | None = field(
        default=1, metadata={"help": "OpenMP threads for fit and predict; None: library default"}
    )

    def __post_init__(self) -> None:
        if self.max_iter < 1 or self.max_leaf_nodes < 2 or self.min_samples_leaf < 1:
            raise ConfigError(
                f"boosting needs max_iter >= 1, max_leaf_nodes >= 2, min_samples_leaf >= 1; "
                f"got {self.max_iter}, {self.max_leaf_nodes}, {self.min_samples_leaf}"
            )
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1 or None, got {self.threads}")
        if not self.learning_rate > 0 or not self.l2_regularization >= 0:
            raise ConfigError(
                f"boosting needs learning_rate > 0 and l2_regularization >= 0; "
                f"got {self.learning_rate}, {self.l2_regularization}"
            )

    def thread_limit(self) -> contextlib.AbstractContextManager[object]:
        """Context in which to fit and predict."""
        if self.threads is None:
            return contextlib.nullcontext()
        return _threadpools().limit(limits=self.threads, user_api="openmp")

    def regressor(self) -> HistGradientBoostingRegressor:
        from sklearn.ensemble import HistGradientBoostingRegressor

        # NOTE: no early stopping: its validation split would tie the fit to the data order.
        return HistGradientBoostingRegressor(
            max_iter=self.max_iter,
            learning_rate=self.learning_rate,
            max_leaf_nodes=self.max_leaf_nodes,
            min_samples_leaf=self.min_samples_leaf,
            l2_regularization=self.l2_regularization,
            early_stopping=False,
            random_state=self.random_state,
        )


# ---------------------------------------------------------------------------------------------
# Features


@functools.cache
def _threadpools() -> ThreadpoolController:
    """The process's thread pools, found once. NOTE: finding them scans every loaded library
    (`threadpool_limits` does it on each call): a router predicting after every turn spent a
    fifth of its CPU there."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


class StepRows(NamedTuple):
    """One row per (trajectory, completed-step count k), trajectories in order, k ascending."""

    features: FloatArray  # (rows, prompt features + len(STEP_FEATURE_NAMES))
    traj_index: IntArray  # position of the row's trajectory in the input sequence
    steps_done: IntArray  # k
    generated: FloatArray  # output tokens of turns [0, k)


def step_features(spec: TrajectorySpec, k: int) -> FloatArray:
    """Features of `spec` after `k` completed steps; reads only prompt features and turns[:k]."""
    if not 0 <= k < spec.num_turns:
        raise ConfigError(f"trajectory {spec.traj_id}: k must be in [0, {spec.num_turns}), got {k}")
    past = spec.turns[:k]
    outputs = np.array([t.output_tokens for t in past], dtype=np.float64)
    inputs = np.array([t.input_tokens for t in past], dtype=np.float64)
    latency = sum(t.tool_latency_s or 0.0 for t in past)
    generated = float(outputs.sum())
    nan = math.nan
    context = [
        float(k),
        generated,
        float(inputs.sum()) + generated,
        outputs[0] if k >= 1 else nan,
        outputs[-1] if k >= 1 else nan,
        generated / k if k >= 1 else nan,
        inputs[-1] if k >= 2 else nan,
        latency,
    ]
    return np.array([*spec.prompt_features, *context], dtype=np.float64)


def steps_features(specs: Sequence[TrajectorySpec]) -> StepRows:
    """`step_features` for every trajectory and every k, vectorised over all turns."""
    width = _prompt_width(specs)
    n_turns = np.array([s.num_turns for s in specs], dtype=np.int64)
    rows = int(n_turns.sum())
    if rows == 0:
        none = np.empty(0, dtype=np.int64)
        features = np.empty((0, width + len(STEP_FEATURE_NAMES)), dtype=np.float64)
        return StepRows(features, none, none, np.empty(0, dtype=np.float64))
    out = np.array([t.output_tokens for s in specs for t in s.turns], dtype=np.int64)
    inp = np.array([t.input_tokens for s in specs for t in s.turns], dtype=np.int64)
    # NOTE: latencies are summed per trajectory, left to right, as `step_features` does: a
    # running sum across the batch would make a row's rounding depend on its neighbours.
    latency = np.fromiter(
        (
            x
            for s in specs
            for x in accumulate((t.tool_latency_s or 0.0 for t in s.turns[:-1]), initial=0.0)
        ),
        dtype=np.float64,
        count=rows,
    )
    traj_index = np.repeat(np.arange(len(specs), dtype=np.int64), n_turns)
    start = np.repeat(np.cumsum(n_turns) - n_turns, n_turns)  # first row of each row's traj
    k = np.arange(rows, dtype=np.int64) - start
    generated = _sum_before(out, start).astype(np.float64)
    prev = np.maximum(np.arange(rows) - 1, 0)  # row of step k - 1 (masked where k = 0)
    seen = k >= 1
    mean_output = np.where(seen, generated / np.maximum(k, 1), np.nan)
    context = np.column_stack(
        [
            k.astype(np.float64),
            generated,
            _sum_before(inp + out, start),
            np.where(seen, out[start], np.nan),
            np.where(seen, out[prev], np.nan),
            mean_output,
            np.where(k >= 2, inp[prev], np.nan),
            latency,
        ]
    )
    prompt = np.array([s.prompt_features for s in specs], dtype=np.float64).reshape(
        len(specs), width
    )
    features = np.hstack([prompt[traj_index], context])
    return StepRows(features, traj_index, k, generated)


def _sum_before(values: IntArray, start: IntArray) -> IntArray:
    """Per row, the sum of `values` over earlier rows of the same trajectory (exclusive);
    integers, so the result is exact whatever else is in the batch."""
    before = np.cumsum(values) - values
    return before - before[start]


def _prompt_width(specs: Sequence[TrajectorySpec]) -> int:
    widths = {len(s.prompt_features) for s in specs}
    if len(widths) > 1:
        raise ConfigError(f"trajectories disagree on the number of prompt features: {widths}")
    return widths.pop() if widths else 0


def _require_history(history: Sequence[TrajectorySpec], who: str) -> None:
    if len(history) == 0:
        raise ConfigError(f"{who}.fit needs at least one historical trajectory, got none")


def _check_width(specs: Sequence[TrajectorySpec], fitted: int, who: str) -> None:
    width = _prompt_width(specs)
    if specs and width != fitted:
        raise ConfigError(
            f"{who} was fitted on {fitted} prompt features, these trajectories have {width}"
        )


def _split(values: FloatArray, specs: Sequence[TrajectorySpec]) -> list[tuple[float, ...]]:
    bounds = np.cumsum([s.num_turns for s in specs])[:-1]
    return [tuple(float(v) for v in part) for part in np.split(values, bounds)]


# ---------------------------------------------------------------------------------------------
# Predictors


class ProgressivePredictor:
    """Heddle's progressive predictor: (context after k steps) -> remaining output tokens.

    Trained on every prefix of every historical trajectory; a prediction is the tokens
    generated so far plus the (non-negative) predicted remainder, so it refines after each step.
    """

    def __init__(self, config: BoostingConfig | None = None) -> None:
        self.config = config or BoostingConfig()
        self._model: HistGradientBoostingRegressor | None = None
        self._width = 0
        self._unseen: npt.NDArray[np.bool_] = np.zeros(0, dtype=bool)

    def fit(self, history: Sequence[TrajectorySpec]) -> Self:
        _require_history(history, type(self).__name__)
        rows = steps_features(history)
        totals = np.array([s.output_tokens for s in history], dtype=np.float64)
        remaining = totals[rows.traj_index] - rows.generated
        assert (remaining >= 1).all(), "every step-k prefix leaves turn k to generate"
        # NOTE: a feature never observed in the history (e.g. `last_tool_output` when no
        # trajectory has three turns) is all NaN, which scikit-learn's binning rejects; it
        # carries no information, so it is held constant in fit and predict alike.
        self._unseen = np.asarray(np.isnan(rows.features).all(axis=0))
        model = self.config.regressor()
        with self.config.thread_limit():
            model.fit(self._seen(rows.features), np.log1p(remaining))
        self._model, self._width = model, rows.features.shape[1] - len(STEP_FEATURE_NAMES)
        return self

    def predict_steps(self, trajs: Sequence[TrajectorySpec]) -> list[tuple[float, ...]]:
        model = self._fitted()
        if not trajs:
            return []
        _check_width(trajs, self._width, type(self).__name__)
        rows = steps_features(trajs)
        with self.config.thread_limit():
            log_remaining = model.predict(self._seen(rows.features))
        remaining = np.maximum(0.0, np.expm1(log_remaining))
        return _split(rows.generated + remaining, trajs)

    def predict_last(self, trajs: Sequence[TrajectorySpec]) -> list[float]:
        """`predict_steps(trajs)[i][-1]` for each trajectory, the model run on that step alone:
        what a router asks after each turn."""
        model = self._fitted()
        if not trajs:
            return []
        _check_width(trajs, self._width, type(self).__name__)
        rows = steps_features(trajs)
        last = np.cumsum([s.num_turns for s in trajs]) - 1
        with self.config.thread_limit():
            log_remaining = model.predict(self._seen(rows.features[last]))
        remaining = np.maximum(0.0, np.expm1(log_remaining))
        return [float(v) for v in rows.generated[last] + remaining]

    def _seen(self, features: FloatArray) -> FloatArray:
        if not self._unseen.any():
            return features
        out = features.copy()
        out[:, self._unseen] = 0.0
        return out

    def _fitted(self) -> HistGradientBoostingRegressor:
        if self._model is None:
            raise RuntimeError(f"{type(self).__name__} is not fitted; call fit(history) first")
        return self._model


class PromptHistoryPredictor:
    """History-based prompt analysis: the mean total of the prompt's historical samples
    (the global mean for an unseen prompt), the same at every step."""

    def __init__(self) -> None:
        self._means: dict[tuple[WorkloadKind | None, int], float] | None = None
        self._global = math.nan

    def fit(self, history: Sequence[TrajectorySpec]) -> Self:
        _require_history(history, type(self).__name__)
        sums: dict[tuple[WorkloadKind | None, int], list[float]] = {}
        for s in history:
            acc = sums.setdefault((s.workload, s.prompt_id), [0.0, 0.0])
            acc[0] += s.output_tokens
            acc[1] += 1
        self._means = {key: total / n for key, (total, n) in sums.items()}
        self._global = float(np.mean([s.output_tokens for s in history]))
        return self

    def predict_steps(self, trajs: Sequence[TrajectorySpec]) -> list[tuple[float, ...]]:
        if self._means is None:
            raise RuntimeError(f"{type(self).__name__} is not fitted; call fit(history) first")
        means = self._means
        return [(means.get((s.workload, s.prompt_id), self._global),) * s.num_turns for s in trajs]


class PromptModelPredictor:
    """Model-based prompt analysis: a regressor on prompt features only, the same every step."""

    def __init__(self, config: BoostingConfig | None = None) -> None:
        self.config = config or BoostingConfig()
        self._model: HistGradientBoostingRegressor | None = None
        self._width = 0

    def fit(self, history: Sequence[TrajectorySpec]) -> Self:
        _require_history(history, type(self).__name__)
        width = _prompt_width(history)
        if width == 0:
            raise ConfigError(f"{type(self).__name__} needs prompt features; history has none")
        x = np.array([s.prompt_features for s in history], dtype=np.float64)
        y = np.log1p(np.array([s.output_tokens for s in history], dtype=np.float64))
        model = self.config.regressor()
        with self.config.thread_limit():
            model.fit(x, y)
        self._model, self._width = model, width
        return self

    def predict_steps(self, trajs: Sequence[TrajectorySpec]) -> list[tuple[float, ...]]:
        if self._model is None:
            raise RuntimeError(f"{type(self).__name__} is not fitted; call fit(history) first")
        if not trajs:
            return []
        _check_width(trajs, self._width, type(self).__name__)
        x = np.array([s.prompt_features for s in trajs], dtype=np.float64)
        with self.config.thread_limit():
            log_totals = self._model.predict(x)
        totals = np.maximum(0.0, np.expm1(log_totals))
        return [(float(v),) * s.num_turns for v, s in zip(totals, trajs, strict=True)]


# ---------------------------------------------------------------------------------------------
# Metrics


def long_tail_recall(
    predicted: Sequence[float] | FloatArray,
    actual: Sequence[float] | FloatArray,
    quantile: float = 0.9,
) -> float:
    """Fraction of the actual top-(1 - quantile) longest that are also predicted in the top
    (the same count, at least one; ties broken by the lower index first)."""
    p, a = _paired(predicted, actual, "long_tail_recall")
    if not 0.0 <= quantile < 1.0:
        raise ConfigError(f"quantile must be in [0, 1), got {quantile}")
    # NOTE: the epsilon keeps e.g. (1 - 0.9) * 1600 = 160.00000000000003 at 160.
    count = max(1, math.ceil((1.0 - quantile) * len(a) - 1e-9))
    top_actual = set(np.argsort(-a, kind="stable")[:count].tolist())
    top_pred = set(np.argsort(-p, kind="stable")[:count].tolist())
    return len(top_actual & top_pred) / count


def pearson(predicted: Sequence[float] | FloatArray, actual: Sequence[float] | FloatArray) -> float:
    """Pearson correlation; NaN (without a warning) for fewer than two points or constant data."""
    p, a = _paired(predicted, actual, "pearson")
    if len(p) < 2 or np.ptp(p) == 0 or np.ptp(a) == 0:
        return math.nan
    from scipy import stats

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.NearConstantInputWarning)
        return float(stats.pearsonr(p, a).statistic)


def _paired(
    predicted: Sequence[float] | FloatArray, actual: Sequence[float] | FloatArray, who: str
) -> tuple[FloatArray, FloatArray]:
    p = np.asarray(predicted, dtype=np.float64)
    a = np.asarray(actual, dtype=np.float64)
    if p.ndim != 1 or p.shape != a.shape or len(p) == 0:
        raise ConfigError(
            f"{who} needs two non-empty 1-D sequences of equal length, got shapes "
            f"{p.shape} and {a.shape}"
        )
    if not (np.isfinite(p).all() and np.isfinite(a).all()):
        raise ConfigError(f"{who} needs finite values")
    return p, a
