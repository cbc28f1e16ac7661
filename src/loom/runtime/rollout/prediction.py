"""The router's online length predictor (Heddle §4.1): it learns from the router's own
history of finished trajectories, kept as JSON lines under `--state-dir`, and is refitted
between batches, off the event loop.

A prediction for a trajectory after k turns runs when its turn k ends, during the tool call,
as §4.1 masks it; the latency of that tool call is not known yet, so the mean of its earlier
calls stands in for it. Before any model is fitted (fewer than `MIN_HISTORY` finished
trajectories) the prediction falls back to the static prompt analysis §4.1 starts from: the
mean total of this prompt's finished trajectories, else of all, else the tokens generated so
far — always more than what the trajectory has already generated.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from loom.core.trajectory import TrajectorySpec, TurnSpec
from loom.rollout.heddle.predictor import ProgressivePredictor
from loom.rollout.history import TrajectoryRecord, write_history

if TYPE_CHECKING:
    from loom.runtime.rollout.state import Trajectory

__all__ = [
    "MIN_HISTORY",
    "Forecasts",
    "OnlinePredictor",
    "entry_spec",
    "pending_spec",
    "trajectory_spec",
]

log = logging.getLogger("loom.rollout")

MIN_HISTORY = 32
"""Finished trajectories before the progressive model replaces the prompt-mean fallback."""

HISTORY_FILE = "history.jsonl"


def _features(prompt_tokens: int) -> tuple[float, ...]:
    # NaN (unknown) only for a declared trajectory whose first turn has not arrived yet
    return (float(prompt_tokens) if prompt_tokens > 0 else math.nan,)


def trajectory_spec(t: Trajectory, *, pending: bool) -> TrajectorySpec | None:
    """`t`'s turns as a `TrajectorySpec`. `pending`: one placeholder turn is appended (the
    one to predict; the predictor reads only the turns before it), and the latest tool call
    gets the mean latency of the earlier ones."""
    recs = t.records
    if not recs and not pending:
        return None
    latencies = [r.tool_latency_s for r in recs if r.tool_latency_s is not None]
    mean_latency = sum(latencies) / len(latencies) if latencies else 0.0
    turns = []
    for i, r in enumerate(recs):
        last = i == len(recs) - 1
        if last and not pending:
            latency = None
        else:
            latency = r.tool_latency_s if r.tool_latency_s is not None else mean_latency
        turns.append(TurnSpec(r.input_tokens, max(1, r.output_tokens), latency))
    if pending:
        turns.append(TurnSpec(0, 1, None))
    return TrajectorySpec(
        traj_id=t.traj_id,
        prompt_id=t.prompt_id,
        sample_idx=0,
        workload=None,  # the router cannot know a trajectory's task
        turns=tuple(turns),
        prompt_features=_features(t.prompt_tokens),
    )


def entry_spec(prompt_id: int, prompt_tokens: int) -> TrajectorySpec:
    """A declared trajectory before its first turn: what predicting its length reads."""
    return TrajectorySpec(
        traj_id=0,
        prompt_id=prompt_id,
        sample_idx=0,
        workload=None,
        turns=(TurnSpec(0, 1, None),),
        prompt_features=_features(prompt_tokens),
    )


def pending_spec(t: Trajectory) -> TrajectorySpec:
    """`t` with its pending turn: what a prediction during its tool call reads."""
    spec = trajectory_spec(t, pending=True)
    assert spec is not None, "a pending turn always makes a spec"
    return spec


class OnlinePredictor:
    """History + the fitted model. `predict` and `fit` are safe to call from a worker thread
    (they read a snapshot); `record` and `install` run on the event loop."""

    def __init__(self, state_dir: Path | None, limit: int) -> None:
        self.path = state_dir / HISTORY_FILE if state_dir is not None else None
        self.history: deque[TrajectorySpec] = deque(maxlen=limit)
        self.model: ProgressivePredictor | None = None
        self.since_fit = 0
        self.fits = 0
        # per prompt and overall: (output tokens, trajectories) of the history window
        self._prompt_sum: dict[int, list[float]] = {}
        self._all = [0.0, 0.0]
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                self._load(self.path)

    def _load(self, path: Path) -> None:
        bad = 0
        with path.open(encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:  # NOTE: line by line: a line torn by a kill must not cost the rest
                    self._remember(TrajectoryRecord.model_validate_json(line).to_spec())
                except (ValidationError, ValueError):
                    bad += 1
        if bad:
            log.warning("skipped %d unreadable lines of %s", bad, path)
        self.since_fit = len(self.history)

    def _remember(self, spec: TrajectorySpec) -> None:
        """Into the history window; the oldest leaves it (and its prompt's mean) when full,
        so that what the router keeps of finished trajectories is bounded by `limit`."""
        if self.history.maxlen is not None and len(self.history) == self.history.maxlen:
            self._count(self.history[0], -1)
        self.history.append(spec)
        self._count(spec, +1)

    def _count(self, spec: TrajectorySpec, sign: int) -> None:
        acc = self._prompt_sum.setdefault(spec.prompt_id, [0.0, 0.0])
        acc[0] += sign * spec.output_tokens
        acc[1] += sign
        self._all[0] += sign * spec.output_tokens
        self._all[1] += sign
        if acc[1] <= 0:
            del self._prompt_sum[spec.prompt_id]

    def record(self, t: Trajectory) -> None:
        spec = trajectory_spec(t, pending=False)
        if spec is None:
            return
        self._remember(spec)
        self.since_fit += 1
        if self.path is not None:
            record = TrajectoryRecord.from_spec(spec).model_copy(
                update={"trajectory_id": t.key, "prompt_id": str(t.prompt_id)}
            )
            write_history(self.path, [record], append=True)

    def due(self, every: int) -> bool:
        return len(self.history) >= MIN_HISTORY and (self.model is None or self.since_fit >= every)

    def fit(self, history: Iterable[TrajectorySpec]) -> ProgressivePredictor:
        return ProgressivePredictor().fit(list(history))

    def install(self, model: ProgressivePredictor) -> None:
        self.model = model
        self.since_fit = 0
        self.fits += 1

    def fallback(self, prompt_id: int, generated: int) -> float:
        acc = self._prompt_sum.get(prompt_id)
        if acc is not None:
            guess = acc[0] / acc[1]
        elif self._all[1] > 0:
            guess = self._all[0] / self._all[1]
        else:
            guess = float(generated)
        return max(guess, generated + 1.0)

    def predict(self, spec: TrajectorySpec, generated: int) -> float:
        """Predicted total output tokens of the trajectory whose pending turn ends `spec`."""
        return self.predict_many([spec], [generated])[0]

    def predict_many(
        self, specs: Sequence[TrajectorySpec], generated: Sequence[int]
    ) -> list[float]:
        """`predict` for many at once (one pass of the model)."""
        model = self.model
        if model is None:
            return [self.fallback(s.prompt_id, g) for s, g in zip(specs, generated, strict=True)]
        totals = model.predict_last(list(specs))
        return [max(total, g + 1.0) for total, g in zip(totals, generated, strict=True)]


class Forecasts:
    """The predictor as the driver runs it: the predictions the core asks for (`Predict`),
    made off the event loop in batches and answered with `Predicted`; what ended trajectories
    teach it (`Record`); and refits as its history grows. NOTE: one batch at a time, the
    newest ask per trajectory: when turns end faster than the model predicts, asks coalesce
    instead of queueing without bound."""

    def __init__(
        self,
        predictor: OnlinePredictor,
        refit_every: int,
        spawn: Callable[[Any], asyncio.Task[Any]],
    ) -> None:
        self.predictor = predictor
        self.refit_every = refit_every
        self._spawn = spawn
        self._asked: dict[int, Trajectory] = {}
        self._wanted = asyncio.Event()
        self._fitting = False

    def ask(self, t: Trajectory) -> None:
        self._asked[t.traj_id] = t  # the newest ask wins
        self._wanted.set()

    def learn(self, t: Trajectory) -> None:
        self.predictor.record(t)
        self.refit_if_due()

    def refit_if_due(self) -> None:
        if self.predictor.due(self.refit_every) and not self._fitting:
            self._fitting = True
            self._spawn(self._refit())

    async def first(self, entries: Sequence[tuple[int, int]]) -> list[float] | None:
        """Predicted totals of declared trajectories, (prompt id, prompt tokens) each,
        before their first turn (None: no model yet, the core's prior stands)."""
        if self.predictor.model is None or not entries:
            return None
        specs = [entry_spec(pid, n) for pid, n in entries]
        return await asyncio.get_running_loop().run_in_executor(
            None, self.predictor.predict_many, specs, [0] * len(specs)
        )

    async def loop(self, send: Callable[[Any], Any]) -> None:
        from loom.runtime.rollout.events import Predicted

        while True:
            await self._wanted.wait()
            self._wanted.clear()
            while self._asked:
                batch = list(self._asked.values())[:256]
                for t in batch:
                    del self._asked[t.traj_id]
                steps = [t.steps_done for t in batch]
                if self.predictor.model is not None:
                    specs = [pending_spec(t) for t in batch]
                    preds = await asyncio.get_running_loop().run_in_executor(
                        None, self.predictor.predict_many, specs, [t.generated for t in batch]
                    )
                else:
                    preds = [self.predictor.fallback(t.prompt_id, t.generated) for t in batch]
                for t, n, pred in zip(batch, steps, preds, strict=True):
                    send(Predicted(t, n, pred))

    async def _refit(self) -> None:
        try:
            history = list(self.predictor.history)
            model = await asyncio.get_running_loop().run_in_executor(
                None, self.predictor.fit, history
            )
            self.predictor.install(model)
            log.info("predictor refitted on %d trajectories", len(history))
        except Exception:
            log.exception("predictor refit failed; keeping the previous model")
        finally:
            self._fitting = False
