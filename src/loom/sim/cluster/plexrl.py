"""Operation-level simulation of RL jobs sharing one training node group (PlexRL §4.4, §6.2).

Each job loops over steps: its rollout runs on its own rollout GPUs; when rollout k ends, the
training operations of step k (compute_log_prob, update_actor, sync_weight) go to the shared
node group one at a time — a job's calls are serial, and step k's start only after step k−1's
sync_weight. The rollout is one step stale (§6.3): rollout k+1 starts when rollout k has ended
and sync_weight of step k−1 has landed. The node group runs one operation at a time, never
preempting (per-WPG serial semantics), in the order an operation policy (`hrrs`, `fcfs`, ...)
plans; running another job's operation first costs the setup the driver's cost model gives
(offload of the resident state, load of the next). Events grow with operations, not time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from loom.cluster.plexrl.group import GroupScheduler
from loom.cluster.plexrl.hrrs import Op, OpPolicy, PlannedOp, SetupCost
from loom.core.errors import ConfigError
from loom.sim.engine import Engine

__all__ = ["GroupJob", "GroupResult", "NodeGroupSimulator", "OpRecord"]


@dataclass(frozen=True, kw_only=True)
class GroupJob:
    """A job on the shared group: its rollout time and training operations per step."""

    job_id: str
    rollout_s: float
    train_ops: tuple[tuple[str, float], ...]  # (name, seconds) in order
    steps: int
    arrival_s: float = 0.0

    def __post_init__(self) -> None:
        if self.steps < 1 or not self.train_ops or self.rollout_s < 0:
            raise ConfigError(f"{self.job_id}: needs >= 1 step, >= 1 operation, rollout >= 0 s")


@dataclass(frozen=True)
class OpRecord:
    job: str
    step: int
    name: str
    arrival_s: float
    start_s: float  # after its setup
    end_s: float
    setup_s: float


@dataclass
class GroupResult:
    records: list[OpRecord]
    step_end_s: dict[str, list[float]]  # per job: when each step's sync_weight ended
    rollout_end_s: dict[str, list[float]]
    span_s: float  # first arrival to the last operation's end

    def busy_s(self) -> float:
        return sum(r.end_s - r.start_s for r in self.records)

    def setup_s(self) -> float:
        return sum(r.setup_s for r in self.records)

    def switches(self) -> int:
        return sum(1 for r in self.records if r.setup_s > 0)

    def job_span_s(self, job: str, arrival: float = 0.0) -> float:
        return self.step_end_s[job][-1] - arrival

    def cycle_s(self, job: str) -> float:
        """Mean step time in steady state: from the second step's end (past the first load)
        to the last's, over the steps between."""
        ends = self.step_end_s[job]
        if len(ends) < 3:
            return ends[-1] / len(ends)
        return (ends[-1] - ends[1]) / (len(ends) - 2)


@dataclass
class _JobState:
    job: GroupJob
    step_rolled: int = 0  # rollouts finished
    step_trained: int = 0  # steps whose sync_weight ended
    rolling: bool = False
    chain: list[tuple[int, int]] = field(default_factory=list)  # (step, op index) to submit
    in_flight: bool = False  # an operation of this job is queued or running


class NodeGroupSimulator:
    """Runs `jobs` over one node group under `policy`; same inputs, same result."""

    def __init__(self, jobs: Sequence[GroupJob], policy: OpPolicy, setup: SetupCost) -> None:
        if len({j.job_id for j in jobs}) != len(jobs):
            raise ConfigError("job ids must be unique")
        self.jobs = {j.job_id: _JobState(j) for j in jobs}
        self.group = GroupScheduler(policy, setup)
        self.eng = Engine()
        self._meta: dict[int, tuple[str, int, int]] = {}  # op id -> (job, step, op index)
        self._next_op = 0
        self.running: PlannedOp | None = None
        self.records: list[OpRecord] = []
        self.step_end: dict[str, list[float]] = {j.job_id: [] for j in jobs}
        self.rollout_end: dict[str, list[float]] = {j.job_id: [] for j in jobs}
        self._seq: dict[str, int] = {j.job_id: 0 for j in jobs}

    def run(self) -> GroupResult:
        for st in self.jobs.values():
            self.eng.schedule(st.job.arrival_s, self._start_rollout, st.job.job_id)
        self.eng.run()
        unfinished = [j for j, st in self.jobs.items() if st.step_trained < st.job.steps]
        assert not unfinished, f"jobs left unfinished: {unfinished}"
        first = min(st.job.arrival_s for st in self.jobs.values())
        last = max(r.end_s for r in self.records)
        return GroupResult(self.records, self.step_end, self.rollout_end, last - first)

    # ---- a job's step loop ----------------------------------------------------------------
    def _start_rollout(self, job_id: str) -> None:
        st = self.jobs[job_id]
        if st.rolling or st.step_rolled >= st.job.steps:
            return
        # one step stale: rollout k+1 needs the weights of step k-1
        if st.step_rolled - st.step_trained > 1:
            return
        st.rolling = True
        self.eng.after(st.job.rollout_s, self._rollout_done, job_id)

    def _rollout_done(self, job_id: str) -> None:
        st = self.jobs[job_id]
        st.rolling = False
        st.step_rolled += 1
        self.rollout_end[job_id].append(self.eng.now)
        k = st.step_rolled - 1
        st.chain.extend((k, i) for i in range(len(st.job.train_ops)))
        self._submit_next(job_id)
        self._start_rollout(job_id)

    def _submit_next(self, job_id: str) -> None:
        st = self.jobs[job_id]
        if st.in_flight or not st.chain:
            return
        step, i = st.chain.pop(0)
        _name, exec_s = st.job.train_ops[i]
        op = Op(self._next_op, job_id, self.eng.now, exec_s, self._seq[job_id])
        self._seq[job_id] += 1
        self._meta[op.op_id] = (job_id, step, i)
        self._next_op += 1
        st.in_flight = True
        self.group.submit(op)
        self._dispatch()

    # ---- the node group -------------------------------------------------------------------
    def _dispatch(self) -> None:
        d = self.group.next(self.eng.now)
        if d is None:
            return
        start = self.eng.now + d.setup_s
        self.running = PlannedOp(d.op, start, start + d.op.exec_s, d.setup_s)
        self.eng.schedule(start + d.op.exec_s, self._op_done)

    def _op_done(self) -> None:
        done = self.running
        assert done is not None, "one operation at a time"
        self.running = None
        self.group.done(done.op.op_id)
        job_id, step, i = self._meta.pop(done.op.op_id)
        st = self.jobs[job_id]
        name, _ = st.job.train_ops[i]
        self.records.append(
            OpRecord(job_id, step, name, done.op.arrival_s, done.start_s, done.end_s, done.setup_s)
        )
        st.in_flight = False
        if i == len(st.job.train_ops) - 1:
            st.step_trained += 1
            self.step_end[job_id].append(self.eng.now)
            self._start_rollout(job_id)
        self._submit_next(job_id)
        self._dispatch()
