"""Action-level discrete-event simulator: drives any `ActionPolicy` with trajectories that
alternate LLM turns with actions, in RL steps of one batch each.

After every batch of same-time events that changed the policy's state (a submission, an end),
the simulator calls `schedule(now)` once, runs each `Start` for its overhead plus the action's
true duration on the testbed's physics (`world`), then reports `finish`. A trajectory's next
LLM turn starts when its action ends; its last action ends it (`end_trajectory`). A
trajectory one of whose actions finally failed is ineffective and its prompt is rolled out
again (`SimConfig.reruns`, §6.2). An RL step ends when every trajectory of its batch and every
re-run has; the next batch starts `step_gap_s` later.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from loom.actions.policy import ActionPolicy, Start
from loom.core.actions import ActionKind, ActionSpec, ActionStatus
from loom.core.errors import ConfigError
from loom.sim.actions.plan import ActionStep, Stage, TrajectoryPlan
from loom.sim.actions.records import ActionRecord, SimResult, StepRecord, TrajectoryRecord
from loom.sim.actions.testbed import Testbed
from loom.sim.actions.world import ApiWorld, Claims, CpuWorld
from loom.sim.engine import Engine

__all__ = ["ActionSimulator", "SimConfig", "TrajectoryAware"]

_DISPATCH = 1  # runs after every same-time event (priority 0)


@runtime_checkable
class TrajectoryAware(Protocol):
    """A policy that acts when a trajectory begins (Kubernetes creates its pod then)."""

    def begin_trajectory(self, trajectory_id: str, now: float) -> None: ...


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    step_gap_s: float = field(
        default=0.0, metadata={"help": "time between RL steps (training); resources idle"}
    )
    api_retries: int = field(default=3, metadata={"help": "retries of a rejected call (§6.1)"})
    api_timeout_s: float = field(default=600.0, metadata={"help": "client timeout (§6.1)"})
    api_backoff_s: float = field(
        default=1.0, metadata={"help": "first retry back-off, doubling (assumed)"}
    )
    reissues: int = field(
        default=2,
        metadata={
            "help": "assumed: times an agent re-issues a failed tool call, each after "
            "another LLM turn"
        },
    )
    # §6.2: "for baseline, frequent API failures cause trajectories to become ineffective,
    # reducing the pass rate of RL training and consequently making the step slow". A
    # trajectory one of whose actions finally failed (retries and re-issues spent) is
    # ineffective; the step re-runs its prompt (same plan, a fresh trajectory) as soon as it
    # ends, so the step ends only once every prompt has an effective trajectory or has been
    # re-run `reruns` times. The bound is assumed (it only guarantees that a step ends).
    reruns: int = field(
        default=3,
        metadata={"help": "re-runs of a prompt whose trajectory was ineffective (bound assumed)"},
    )

    def __post_init__(self) -> None:
        if self.api_retries < 0 or self.reissues < 0 or self.reruns < 0:
            raise ConfigError("api_retries, reissues and reruns must be >= 0")
        if not (self.api_timeout_s > 0 and self.api_backoff_s >= 0 and self.step_gap_s >= 0):
            raise ConfigError("api_timeout_s must be > 0; back-off and step gap >= 0")


@dataclass(slots=True)
class _Traj:
    plan: TrajectoryPlan
    rl_step: int
    start_s: float
    index: int = 0
    reissues_left: int = 0
    llm_s: float = 0.0
    tool_s: float = 0.0
    reward_s: float = 0.0
    actions: int = 0
    failed: int = 0
    run: int = 0  # 0 for the batch's own trajectory, k for the k-th re-run of its prompt


@dataclass(slots=True)
class _Live:
    spec: ActionSpec
    step: ActionStep
    traj: _Traj
    submit_s: float
    start_s: float = math.nan
    units: int = 0
    domain: str = ""
    overhead_s: float = 0.0
    attempts: int = 0
    api_key: str = ""


class ActionSimulator:
    """One run: `batches[k]` are the trajectories of RL step k, all starting together."""

    def __init__(
        self,
        policy: ActionPolicy,
        testbed: Testbed,
        batches: Sequence[Sequence[TrajectoryPlan]],
        config: SimConfig | None = None,
    ) -> None:
        if not batches or not all(batches):
            raise ConfigError("the simulator needs at least one non-empty batch")
        ids = [p.trajectory_id for b in batches for p in b]
        if len(set(ids)) != len(ids):
            raise ConfigError("trajectory ids repeat across the batches")
        self.policy = policy
        self.testbed = testbed
        self.batches = [list(b) for b in batches]
        self.config = config or SimConfig()
        self.engine = Engine()
        self._cpu = CpuWorld(self.engine, testbed)
        self._api = ApiWorld(testbed)
        self._claims = Claims(testbed)
        self._live: dict[str, _Live] = {}
        self._records: list[ActionRecord] = []
        self._trajs: list[TrajectoryRecord] = []
        self._steps: list[StepRecord] = []
        self._open: dict[int, int] = {}  # RL step -> trajectories not yet finished
        self._step_start: dict[int, float] = {}
        self._dispatch_pending = False
        self._wake_at = math.inf
        self._decisions = 0
        self.counters: dict[str, float] = {
            "submitted": 0,
            "api_rejections": 0,
            "api_retries": 0,
            "api_timeouts": 0,
            "failed": 0,
            "reissued": 0,
            "ineffective": 0,
            "reruns": 0,
            "restores": 0,
        }

    # -- driver ------------------------------------------------------------------------------
    def run(self) -> SimResult:
        self.engine.schedule(0.0, self._begin_step, 0)
        self.engine.run()
        self._check_drained()
        return SimResult(
            actions=tuple(self._records),
            trajectories=tuple(self._trajs),
            steps=tuple(self._steps),
            counters=dict(self.counters),
            decisions=self._decisions,
        )

    def _check_drained(self) -> None:
        open_trajs = sum(self._open.values())
        assert not self._live and open_trajs == 0, (
            f"simulation stalled: {len(self._live)} actions unfinished, {open_trajs} trajectories "
            f"open, policy has {self.policy.queued} queued and {self.policy.running} running"
        )
        assert self.policy.queued == 0 and self.policy.running == 0, "policy still holds actions"
        assert len(self._steps) == len(self.batches), "an RL step never ended"
        assert self._claims.held == 0, "devices still claimed after the run"
        assert len(self._records) == self.counters["submitted"], "an action was lost"

    def _begin_step(self, k: int) -> None:
        now = self.engine.now
        self._step_start[k] = now
        self._open[k] = len(self.batches[k])
        for plan in self.batches[k]:
            self._begin_trajectory(plan, k, 0)
        if isinstance(self.policy, TrajectoryAware):
            self._touch()

    def _begin_trajectory(self, plan: TrajectoryPlan, k: int, run: int) -> None:
        now = self.engine.now
        tr = _Traj(plan, k, now, reissues_left=self.config.reissues, run=run)
        if isinstance(self.policy, TrajectoryAware):
            self.policy.begin_trajectory(plan.trajectory_id, now)
        self._next(tr)

    def _next(self, tr: _Traj) -> None:
        """Start the trajectory's next LLM turn, or its tail and end."""
        steps = tr.plan.steps
        if tr.index < len(steps):
            step = steps[tr.index]
            tr.llm_s += step.llm_s
            self.engine.after(step.llm_s, self._submit, tr, step, step.spec)
        else:
            tr.llm_s += tr.plan.tail_llm_s
            self.engine.after(tr.plan.tail_llm_s, self._end_trajectory, tr)

    def _submit(self, tr: _Traj, step: ActionStep, spec: ActionSpec) -> None:
        now = self.engine.now
        live = _Live(spec, step, tr, now)
        if spec.kind == ActionKind.API:
            keys = [k for k in spec.demand if k.startswith("api:")]
            assert len(keys) == 1, f"API action {spec.action_id} must name exactly one API"
            live.api_key = keys[0]
        self._live[spec.action_id] = live
        self.counters["submitted"] += 1
        self.policy.submit(spec, now)
        self._touch()

    def _touch(self) -> None:
        if not self._dispatch_pending:
            self._dispatch_pending = True
            self.engine.after(0.0, self._dispatch, priority=_DISPATCH)

    def _dispatch(self) -> None:
        self._dispatch_pending = False
        now = self.engine.now
        self._decisions += 1
        for start in self.policy.schedule(now):
            self._launch(start)
        wake = self.policy.next_wakeup(now)
        if wake is not None:
            assert wake > now, f"policy asked to be woken at {wake}, not after now={now}"
            if wake < self._wake_at or self._wake_at <= now:
                self._wake_at = wake
                self.engine.schedule(wake, self._wake)

    def _wake(self) -> None:
        if self.engine.now >= self._wake_at:
            self._wake_at = math.inf
        self._touch()

    # -- execution on the testbed ----------------------------------------------------------
    def _launch(self, start: Start) -> None:
        spec = start.action
        live = self._live.get(spec.action_id)
        assert live is not None, f"policy started {spec.action_id}, which is not submitted"
        assert math.isnan(live.start_s), f"policy started {spec.action_id} twice"
        assert start.units >= 1 and start.overhead_s >= 0, f"bad start of {spec.action_id}"
        now = self.engine.now
        live.start_s, live.units, live.overhead_s = now, start.units, start.overhead_s
        live.domain = start.domain
        if start.overhead_s > 0:
            self.counters["restores"] += 1
        for g in start.grants:
            self._claims.claim(spec.action_id, g.domain, g.cores, g.gpus)
        noise = live.step.noise
        aid = spec.action_id
        if spec.kind == ActionKind.CPU_TOOL:
            work = spec.t_ori_s * noise
            speedup = spec.speedup(start.units)
            self.engine.after(
                start.overhead_s,
                self._cpu.join,
                aid,
                start.domain,
                start.units,
                speedup,
                work,
                lambda: self._end(aid, ActionStatus.SUCCEEDED),
            )
        elif spec.kind == ActionKind.API:
            self.engine.after(start.overhead_s, self._attempt, aid)
        else:
            run_s = spec.duration_s(start.units) * noise
            self.engine.after(start.overhead_s + run_s, self._end, aid, ActionStatus.SUCCEEDED)

    def _attempt(self, aid: str) -> None:
        """One call to the provider; rejected calls error after a latency and are retried
        after an exponential back-off, at most `api_retries` times (§6.1)."""
        live = self._live[aid]
        live.attempts += 1
        now = self.engine.now
        cfg = self.config
        if self._api.admit(live.api_key, now):
            latency = live.spec.t_ori_s * live.step.noise
            if latency > cfg.api_timeout_s:
                self.counters["api_timeouts"] += 1
                self.engine.after(cfg.api_timeout_s, self._call_failed, aid, True)
            else:
                self.engine.after(latency, self._call_done, aid)
            return
        self.counters["api_rejections"] += 1
        err = self._api.provider(live.api_key).error_latency_s
        self.engine.after(err, self._call_failed, aid, False)

    def _call_done(self, aid: str) -> None:
        self._api.release(self._live[aid].api_key)
        self._end(aid, ActionStatus.SUCCEEDED)

    def _call_failed(self, aid: str, admitted: bool) -> None:
        live = self._live[aid]
        if admitted:
            self._api.release(live.api_key)
        if live.attempts > self.config.api_retries:
            self._end(aid, ActionStatus.TIMED_OUT if admitted else ActionStatus.FAILED)
            return
        self.counters["api_retries"] += 1
        backoff = self.config.api_backoff_s * 2 ** (live.attempts - 1)
        self.engine.after(backoff, self._attempt, aid)

    def _end(self, aid: str, status: ActionStatus) -> None:
        live = self._live.pop(aid)
        now = self.engine.now
        self._claims.release(aid)
        self.policy.finish(aid, now)
        tr = live.traj
        rec = ActionRecord(
            action_id=aid,
            trajectory_id=tr.plan.trajectory_id,
            workload=tr.plan.workload,
            task=tr.plan.task,
            stage=live.step.stage,
            kind=live.spec.kind,
            rl_step=tr.rl_step,
            submit_s=live.submit_s,
            start_s=live.start_s,
            end_s=now,
            units=live.units,
            domain=live.domain,
            overhead_s=live.overhead_s,
            status=status,
            attempts=max(live.attempts, 1),
        )
        self._records.append(rec)
        tr.actions += 1
        if live.step.stage == Stage.REWARD:
            tr.reward_s += rec.act_s
        else:
            tr.tool_s += rec.act_s
        self._touch()
        if status != ActionStatus.SUCCEEDED:
            tr.failed += 1
            self.counters["failed"] += 1
            if live.step.stage == Stage.TOOL and tr.reissues_left > 0:
                tr.reissues_left -= 1
                self.counters["reissued"] += 1
                again = dataclasses.replace(live.spec, action_id=f"{aid}.r")
                tr.llm_s += live.step.llm_s
                self.engine.after(live.step.llm_s, self._submit, tr, live.step, again)
                return
        tr.index += 1
        self._next(tr)

    def _end_trajectory(self, tr: _Traj) -> None:
        now = self.engine.now
        self.policy.end_trajectory(tr.plan.trajectory_id, now)
        self._touch()
        self._trajs.append(
            TrajectoryRecord(
                trajectory_id=tr.plan.trajectory_id,
                workload=tr.plan.workload,
                task=tr.plan.task,
                rl_step=tr.rl_step,
                start_s=tr.start_s,
                end_s=now,
                llm_s=tr.llm_s,
                tool_s=tr.tool_s,
                reward_s=tr.reward_s,
                actions=tr.actions,
                failed=tr.failed,
                run=tr.run,
            )
        )
        k = tr.rl_step
        if tr.failed:
            self.counters["ineffective"] += 1
            if tr.run < self.config.reruns:
                self.counters["reruns"] += 1
                self._open[k] += 1
                self._begin_trajectory(_rerun_plan(tr.plan, tr.run + 1), k, tr.run + 1)
                self._touch()
        self._open[k] -= 1
        if self._open[k] == 0:
            self._steps.append(StepRecord(rl_step=k, start_s=self._step_start[k], end_s=now))
            if k + 1 < len(self.batches):
                self.engine.after(self.config.step_gap_s, self._begin_step, k + 1)


def _rerun_plan(plan: TrajectoryPlan, run: int) -> TrajectoryPlan:
    """The prompt of `plan` rolled out again: the same steps under fresh ids."""
    old, tid = plan.trajectory_id, f"{plan.trajectory_id}~{run}"

    def rename(spec: ActionSpec) -> ActionSpec:
        aid = spec.action_id
        aid = tid + aid[len(old) :] if aid.startswith(old) else f"{tid}/{aid}"
        return dataclasses.replace(spec, action_id=aid, trajectory_id=tid)

    steps = tuple(dataclasses.replace(s, spec=rename(s.spec)) for s in plan.steps)
    return dataclasses.replace(plan, trajectory_id=tid, steps=steps)
