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
from loom.cluster.plexrl.hrrs import OpPolicy, SetupCost
from loom.core.errors import ConfigError
from loom.runtime.cluster import events as ev
from loom.runtime.cluster.core import ClusterCore, CoreSettings
from loom.runtime.cluster.records import Deployment
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
    """Runs `jobs` over one node group under `policy`; same inputs, same result. The group's
    decisions are the cluster service's own core (`ClusterCore`): the simulator submits each
    operation, takes the core's commands and ends each step at its simulated time, so the
    service and the simulator cannot drift apart."""

    def __init__(self, jobs: Sequence[GroupJob], policy: OpPolicy, setup: SetupCost) -> None:
        if len({j.job_id for j in jobs}) != len(jobs):
            raise ConfigError("job ids must be unique")
        self.jobs = {j.job_id: _JobState(j) for j in jobs}
        names = tuple(dict.fromkeys(name for j in jobs for name, _ in j.train_ops))
        self.core = ClusterCore(
            CoreSettings(groups=1, known_ops=names), op_policy=lambda: policy, setup=setup
        )
        for j in jobs:  # (no job's state is on the group before its first operation)
            self.core.add(Deployment(j.job_id, j.job_id, 0), resident=False)
        self.eng = Engine()
        self._meta: dict[int, tuple[str, int, int]] = {}  # op id -> (job, step, op index)
        self._setup: dict[int, float] = {}  # a dispatched operation's switch, in seconds
        self.records: list[OpRecord] = []
        self.step_end: dict[str, list[float]] = {j.job_id: [] for j in jobs}
        self.rollout_end: dict[str, list[float]] = {j.job_id: [] for j in jobs}

    @property
    def group(self) -> GroupScheduler:
        return self.core.groups[0]

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
        name, exec_s = st.job.train_ops[i]
        st.in_flight = True
        cmds = self.core.handle(ev.Submit(job_id, name, {}, estimate_s=exec_s), self.eng.now)
        accepted = cmds[0]
        assert isinstance(accepted, ev.Accepted)
        self._meta[accepted.op_id] = (job_id, step, i)
        self._carry_out(cmds[1:])

    # ---- the node group: the core's commands, carried out in simulated time ----------------
    def _carry_out(self, cmds: list[ev.Command]) -> None:
        for cmd in cmds:
            if isinstance(cmd, ev.Dispatch):  # (the group is free: its turn is now)
                self._setup[cmd.op_id] = self.core.dispatched(cmd.op_id).setup_s
                self._carry_out(self.core.handle(ev.Turn(cmd.group, cmd.op_id), self.eng.now))
            elif isinstance(cmd, ev.Run):
                self.eng.after(self._duration(cmd), self._step_ended, cmd.op_id)
            elif isinstance(cmd, ev.Ended):
                self._ended(cmd.op_id)
            else:  # hints to a node's state manager: none here
                assert isinstance(cmd, ev.Hint), f"the simulator cannot carry out {cmd!r}"

    def _duration(self, run: ev.Run) -> float:
        """A step's simulated time: the whole switch on its load (the offload before it
        takes none), an operation its job's own duration."""
        if run.kind == "offload":
            return 0.0
        if run.kind == "load":
            owner = next(op for op, (job, _, _) in self._meta.items() if job == run.dep)
            return self._setup[owner]
        job_id, _, i = self._meta[run.op_id]
        return self.jobs[job_id].job.train_ops[i][1]

    def _step_ended(self, op_id: int) -> None:
        if op_id in self._meta:  # a job's operation: its next one queues before the group
            self._job_goes_on(op_id)  # picks what runs next, as a caller's does in the service
        self._carry_out(self.core.handle(ev.StepEnded(op_id, ev.Ok(None, 0.0)), self.eng.now))

    def _job_goes_on(self, op_id: int) -> None:
        job_id, _, i = self._meta[op_id]
        st = self.jobs[job_id]
        st.in_flight = False
        if i == len(st.job.train_ops) - 1:
            st.step_trained += 1
            self.step_end[job_id].append(self.eng.now)
            self._start_rollout(job_id)
        self._submit_next(job_id)

    def _ended(self, op_id: int) -> None:
        if op_id not in self._meta:  # an offload or a load
            return
        rec = self.core.ops[op_id]
        assert rec.started_s is not None and rec.ended_s is not None
        job_id, step, i = self._meta.pop(op_id)
        setup_s = self._setup.pop(op_id)  # (as planned: the core's is measured, to the ulp)
        name, _ = self.jobs[job_id].job.train_ops[i]
        self.records.append(
            OpRecord(job_id, step, name, rec.submitted_s, rec.started_s, rec.ended_s, setup_s)
        )
