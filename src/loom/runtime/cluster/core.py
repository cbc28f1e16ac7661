"""The cluster service's decisions as one object without I/O (PlexRL §4.4, §5.2): operations
queued and dispatched per node group, a group's switch between jobs, deadlines, what a failed
step means for its worker group, recovery, a rank's death, deletion and shutdown.

`ClusterCore.handle(event, now) -> commands` (`events`). Every operation moves through
`OP_TRANSITIONS` and every deployment through `DEPLOYMENT_TRANSITIONS` (`records`); a move
the table does not allow raises `IllegalTransition`. The driver (`driver.ClusterDriver`) turns
I/O into events and carries out commands; it holds a node group while a `Turn`, `Park`,
`RankDied` or `NodeLost` runs, so on each group one flow of steps is in progress at a time.

One operation's flow on its group: (a plan hint) → offload the resident job → load its own
(a second try after its group was started again) → run it. A step that fails is judged: a
broken group, or ranks that never settle after one raised, is torn down and, as
`RecoveryPolicy` decides, started again from its offloaded state or failed with its queued
operations. A failure never reaches another deployment's operation.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from loom.cluster.faults import DeadlinePolicy, RecoveryAction, RecoveryPolicy
from loom.cluster.plexrl.group import Dispatch, GroupScheduler
from loom.cluster.plexrl.hrrs import OP_POLICIES, Op, OpPolicy, OpPolicyKind, SetupCost
from loom.cluster.plexrl.placement import JobPlacement, PlacementConfig, PlexPlacement
from loom.cluster.plexrl.timeline import HORIZON_SLOTS, Footprint, Timeline
from loom.core.errors import ConfigError, Conflict, NotFound
from loom.runtime.cluster import events as ev
from loom.runtime.cluster.records import Deployment, DeploymentStatus, OpRecord, OpStatus

__all__ = ["ClusterCore", "CoreSettings"]

EWMA = 0.5  # weight of the newest measurement in a duration estimate


class Stage(StrEnum):
    OFFLOAD = "offload"  # the resident job's state leaves the group's devices
    LOAD = "load"  # the operation's job's state comes up
    RUN = "run"  # the operation itself
    PARK = "park"  # an idle deployment offloaded to wait for its turn


@dataclass
class Flow:
    """The steps of one operation (or one park) on a node group, in progress."""

    group: int
    dep: str
    op_id: int | None  # the user's operation (None: a park)
    stage: Stage
    old: str | None = None  # the resident job a switch offloads
    step: int | None = None  # the record running now
    tries: int = 0  # loads tried
    switch_t0: float = 0.0
    why: str = ""
    recover: bool = False  # (a park) tear down a group its offload breaks
    failed: int | None = None  # the record of the step that failed
    no_room: bool = False  # ... for want of room on the node
    pending: tuple[int, ...] = ()  # ... and the ranks that had not answered it
    waiting: tuple[str, str] | None = None  # ("settle" | "recover", deployment)


@dataclass
class CoreSettings:
    groups: int = 1
    policy: OpPolicyKind = OpPolicyKind.HRRS
    default_exec_s: float = 1.0
    default_switch_s: float = 1.0
    settle_s: float = 10.0
    retain_ops: int = 10_000
    known_ops: tuple[str, ...] = ()  # what a caller may submit
    deadlines: DeadlinePolicy = field(default_factory=DeadlinePolicy)
    recovery: RecoveryPolicy = field(default_factory=RecoveryPolicy)

    def __post_init__(self) -> None:
        if self.groups < 1:
            raise ConfigError(f"groups must be >= 1, got {self.groups}")
        if self.retain_ops < 1:
            raise ConfigError(f"retain_ops must be >= 1, got {self.retain_ops}")


class ClusterCore:
    def __init__(
        self,
        settings: CoreSettings,
        *,
        op_policy: Callable[[], OpPolicy] | None = None,
        setup: SetupCost | None = None,
    ) -> None:
        """`op_policy` makes each node group's operation policy (`settings.policy`'s by
        default); `setup` is what a switch costs (by default the switches measured here, else
        `default_switch_s`): the simulator injects its cost model."""
        self.settings = s = settings
        self.deployments: dict[str, Deployment] = {}
        self.ops: dict[int, OpRecord] = {}
        make_policy = op_policy or OP_POLICIES.get(s.policy)
        self.groups = [
            GroupScheduler(make_policy(), setup or self._setup_estimate) for _ in range(s.groups)
        ]
        # PlexRL's placement over the node groups (one timeline node each): cold starts take a
        # group of their own, profiled traces are fitted with a phase shift
        self.placement = PlexPlacement(
            Timeline(nodes=s.groups, horizon=HORIZON_SLOTS),
            PlacementConfig(groups=tuple((g,) for g in range(s.groups)), duty_bound=1.0),
        )
        self.closing = False
        self.forgotten = 0  # finished operations dropped beyond retain_ops
        self._finished: collections.deque[int] = collections.deque()
        self._last_id = -1
        self._flows: dict[int, Flow] = {}  # group -> its flow in progress
        self._side: dict[int, str] = {}  # checkpoints of offloaded state under way -> dep
        self._dispatched: dict[int, Dispatch] = {}  # what the scheduler planned, until its turn
        self._reasons: dict[str, str] = {}  # deployments being recovered -> why
        self._plans: list[list[str]] = [[] for _ in range(s.groups)]  # the last sent per node
        self._exec: dict[tuple[str, str], float] = {}  # (deployment, op) -> seconds
        self._measured: dict[tuple[str, str], float] = {}  # the same, from runs only
        self._switch: dict[str, float] = {}  # deployment -> offload + load seconds
        self.counts = {
            "ops": 0,
            "switches": 0,
            "failed": 0,
            "offloaded_checkpoints": 0,
            "migrations": 0,
            "restarts": 0,
            "failed_deployments": 0,
        }

    # ---- the one entry -----------------------------------------------------------------------
    def handle(self, event: ev.Event, now: float) -> list[ev.Command]:
        handler = self._HANDLERS[type(event)]
        return handler(self, event, now)

    # ---- deployments (what the driver has started or placed) ---------------------------------
    def place(
        self, dep_id: str, group: int | None, trace: Footprint | None, now: float
    ) -> tuple[int, JobPlacement | None]:
        """A new deployment's node group: `group` if named; else, with a profiled `trace`,
        where PlexRL's placement fits it (§4.3.2, warm start); else a group of its own (cold
        start) while one is free, and the least-shared group when none is."""
        if group is not None and not 0 <= group < len(self.groups):
            raise ConfigError(f"no node group {group} (this service has {len(self.groups)})")
        self.placement.timeline.advance(int(now))
        if group is not None:
            return group, None
        placed = (
            self.placement.place(dep_id, trace)
            if trace is not None
            else self.placement.cold_start(dep_id, nodes=1)
        )
        if placed is not None:
            return placed.group, placed
        loads = [
            sum(1 for d in self.deployments.values() if d.group == g)
            for g in range(len(self.groups))
        ]
        return loads.index(min(loads)), None  # NOTE: shared unplaced, rather than refused

    def repack(self, dep_id: str, trace: Footprint, now: float) -> JobPlacement | None:
        """Place a deployment from its profiled cycle (§4.3.2: cold start, then repacking);
        None if nothing fits (it stays where it is). The caller moves it if its group
        changes."""
        if self.busy(dep_id):
            raise Conflict(f"{dep_id} has operations queued or running: repack it between steps")
        self.placement.timeline.advance(int(now))
        if self.placement.group_of(dep_id) is not None:
            placed = self.placement.repack(dep_id, trace)
        else:
            placed = self.placement.place(dep_id, trace)
        if placed is not None:
            self.deployments[dep_id].placement = placed
        return placed

    def release(self, dep_id: str) -> None:
        if self.placement.group_of(dep_id) is not None:
            self.placement.release(dep_id)

    def add(
        self, dep: Deployment, estimates: dict[str, float] | None = None, *, resident: bool = True
    ) -> bool:
        """Record a started deployment; True if it must wait offloaded for its turn (its
        group holds another job's state, or is busy). A deployment starts resident where
        its group is free; `resident=False`: its state is not on the group yet (its first
        operation loads it)."""
        self.deployments[dep.id] = dep
        for kind, secs in (estimates or {}).items():
            self._exec[(dep.id, kind)] = float(secs)
        sched = self.groups[dep.group]
        if not resident:
            return False
        if sched.resident is None and sched.running is None:
            sched.resident = dep.id
            return False
        return True

    def remove(self, dep_id: str) -> None:
        """A deployment that never served (its start was undone)."""
        self.deployments.pop(dep_id, None)
        self.release(dep_id)

    def ready(self, dep_id: str) -> Deployment:
        dep = self.deployments.get(dep_id)
        if dep is None or dep.deleting:
            raise NotFound(f"no deployment {dep_id!r}")
        if dep.status is DeploymentStatus.FAILED:
            raise Conflict(
                f"deployment {dep_id} failed: {dep.error}. Delete job {dep.job} to free its "
                "name, then create it again"
            )
        return dep

    def busy(self, dep_id: str) -> bool:
        """Whether `dep_id` has operations queued or running (move it between steps)."""
        dep = self.deployments[dep_id]
        sched = self.groups[dep.group]
        return (
            dep.migrating
            or any(o.job == dep_id for o in sched.queue)
            or (sched.running is not None and sched.running.job == dep_id)
        )

    def moved(self, dep_id: str, group: int) -> None:
        """A deployment landed on another node group (its state moved there)."""
        self.deployments[dep_id].group = group
        self.counts["migrations"] += 1

    def plan_reset(self, group: int) -> None:
        """A node's state manager started again: the plan it had is gone."""
        self._plans[group] = []

    def resident(self, group: int) -> str | None:
        return self.groups[group].resident

    def running_on(self, dep_id: str) -> bool:
        dep = self.deployments.get(dep_id)
        if dep is None:
            return False
        run = self.groups[dep.group].running
        return run is not None and run.job == dep_id

    def in_use(self, dep_id: str) -> bool:
        """Whether a command the core gave may still touch `dep_id`'s worker group: its
        operation runs, a switch loads or offloads it, it is being parked or recovered, or
        its offloaded state is checkpointed. A deleted deployment is forgotten (its group
        closed) only once it is not."""
        dep = self.deployments.get(dep_id)
        if dep is None:
            return False
        return (
            self.running_on(dep_id)
            or dep.status is DeploymentStatus.RECOVERING
            or dep_id in self._side.values()
            or any(
                dep_id == f.dep
                or (dep_id == f.old and f.stage is Stage.OFFLOAD)
                or (f.waiting is not None and f.waiting[1] == dep_id)
                for f in self._flows.values()
            )
        )

    def deadline(self, dep_id: str, kind: str, override_s: float | None) -> float:
        """How long an operation of `kind` may run: from its measured duration once it has
        run, else the deployment's estimate, else the service's default."""
        s = self.settings
        key = (dep_id, kind)
        default = s.default_switch_s if kind in ("offload", "load") else s.default_exec_s
        expected = self._measured.get(key, self._exec.get(key, default))
        return s.deadlines.deadline_s(expected, override_s)

    # ---- submissions -------------------------------------------------------------------------
    def _submit(self, e: ev.Submit, now: float) -> list[ev.Command]:
        if self.closing:
            raise Conflict("the service is shutting down")
        dep = self.ready(e.dep)
        if e.kind not in self.settings.known_ops:
            raise ConfigError(
                f"unknown operation {e.kind!r}; known: {', '.join(self.settings.known_ops)}"
            )
        if e.deadline_s is not None and not e.deadline_s > 0:
            raise ConfigError(f"deadline_s must be > 0, got {e.deadline_s}")
        if dep.migrating:
            raise Conflict(f"{e.dep} is moving to another node group: call again when it has")
        rec = self._record(dep, e.kind, e.payload, now)
        rec.override_s = e.deadline_s
        self.counts["ops"] += 1
        if e.kind == "save_ckpt" and self._offloaded_and_idle(dep):
            # a checkpoint from the state the sidecar holds: no switch, the group runs on
            self._start(rec, now)
            self._side[rec.op_id] = dep.id
            path = str(e.payload["path"])
            return [
                ev.Accepted(rec.op_id),
                ev.Checkpoint(dep.id, rec.op_id, path, rec.deadline_s or 0),
            ]
        exec_s = (
            e.estimate_s
            if e.estimate_s is not None
            else self._exec.get((dep.id, e.kind), self.settings.default_exec_s)
        )
        self.groups[dep.group].submit(Op(rec.op_id, dep.id, rec.submitted_s, exec_s, dep.seq))
        dep.seq += 1
        return [ev.Accepted(rec.op_id), *self._pump(dep.group, now)]

    def _record(
        self, dep: Deployment, kind: str, payload: dict[str, Any], now: float, system: bool = False
    ) -> OpRecord:
        self._last_id += 1
        rec = OpRecord(self._last_id, dep.id, dep.job, kind, payload, now, system=system)
        self.ops[rec.op_id] = rec
        return rec

    def _offloaded_and_idle(self, dep: Deployment) -> bool:
        sched = self.groups[dep.group]
        return (
            dep.status is DeploymentStatus.READY
            and sched.resident != dep.id
            and not self.busy(dep.id)
            and not any(dep.id in (f.dep, f.old) for f in self._flows.values())
            and dep.id not in self._side.values()
        )

    def _pump(self, group: int, now: float) -> list[ev.Command]:
        if self.closing:
            return []
        d = self.groups[group].next(now)  # (none while one runs)
        if d is None:
            return []
        self._dispatched[d.op.op_id] = d
        return [ev.Dispatch(group, d.op.op_id)]

    def last_id(self) -> int:
        return self._last_id

    def dispatched(self, op_id: int) -> Dispatch:
        """The switch the scheduler planned for a dispatched operation, until its turn."""
        return self._dispatched[op_id]

    # ---- one operation's flow on its group ---------------------------------------------------
    def _live(self, dep_id: str | None) -> Deployment | None:
        dep = self.deployments.get(dep_id) if dep_id is not None else None
        ok = dep is not None and dep.status is DeploymentStatus.READY and not dep.deleting
        return dep if ok else None

    def _turn(self, e: ev.Turn, now: float) -> list[ev.Command]:
        assert e.group not in self._flows, f"group {e.group} runs a flow already"
        rec = self.ops[e.op_id]
        sched = self.groups[e.group]
        assert sched.running is not None and sched.running.op_id == e.op_id, "not its turn"
        dep = self.deployments.get(rec.deployment)
        d = self._dispatched.pop(e.op_id)  # the switch planned when it was dispatched
        if dep is None or dep.deleting or dep.status is not DeploymentStatus.READY:
            # (it failed or went while this waited: its switch never happens)
            if d.load is not None:
                sched.resident = d.offload if self._live(d.offload) else None
            if dep is not None and dep.status is DeploymentStatus.FAILED:
                gone = self._end(rec, OpStatus.FAILED, now, f"{dep.id} failed: {dep.error}")
            else:
                gone = self._end(rec, OpStatus.CANCELLED, now, "its deployment is gone")
            return gone + self._done(e.group, e.op_id, now)
        flow = Flow(e.group, dep.id, e.op_id, Stage.RUN)
        self._flows[e.group] = flow
        cmds: list[ev.Command] = []
        upcoming = [j for j in sched.upcoming if self._live(j) is not None]
        if upcoming != self._plans[e.group]:  # the switch's eviction follows it
            self._plans[e.group] = upcoming
            cmds.append(ev.Hint(dep.id, "plan", tuple(upcoming)))
        if d.load is not None or d.offload is not None:
            flow.switch_t0 = now
            live_old = self._live(d.offload)
            if live_old is not None:
                flow.stage, flow.old = Stage.OFFLOAD, live_old.id
                return cmds + self._step(flow, live_old, "offload", now)
            sched.resident = None
            flow.stage = Stage.LOAD
            return cmds + self._load(flow, now)
        return cmds + self._run(flow, now)

    def _step(self, flow: Flow, dep: Deployment, kind: str, now: float) -> list[ev.Command]:
        """Offload or load `dep`'s state: an operation of its own in the records."""
        payload = {"tier": "host"} if kind == "offload" else {}
        rec = self._record(dep, kind, payload, now, system=True)
        self._start(rec, now)
        flow.step = rec.op_id
        return [ev.Run(dep.id, rec.op_id, kind, payload, rec.deadline_s or 0.0)]

    def _load(self, flow: Flow, now: float) -> list[ev.Command]:
        flow.tries += 1
        return self._step(flow, self.deployments[flow.dep], "load", now)

    def _run(self, flow: Flow, now: float) -> list[ev.Command]:
        cmds: list[ev.Command] = []
        other = self._live(next((j for j in self._plans[flow.group] if j != flow.dep), None))
        if other is not None:  # its state comes up while this one runs
            cmds.append(ev.Hint(other.id, "prefetch"))
        flow.stage = Stage.RUN
        assert flow.op_id is not None
        rec = self.ops[flow.op_id]
        self._start(rec, now)
        flow.step = rec.op_id
        return [*cmds, ev.Run(flow.dep, rec.op_id, rec.kind, rec.payload, rec.deadline_s or 0.0)]

    def _start(self, rec: OpRecord, now: float) -> None:
        rec.move(OpStatus.RUNNING)
        rec.started_s = now
        rec.deadline_s = self.deadline(rec.deployment, rec.kind, rec.override_s)

    def _step_ended(self, e: ev.StepEnded, now: float) -> list[ev.Command]:
        rec = self.ops[e.op_id]
        dep = self.deployments.get(rec.deployment)
        if isinstance(e.outcome, ev.Ok):
            self._learn((rec.deployment, rec.kind), e.outcome.took_s)
            rec.result = e.outcome.result
            cmds = self._end(rec, OpStatus.SUCCEEDED, now)
        elif (dep is not None and dep.deleting) or self.closing:
            why = "the service stopped" if self.closing else f"job {rec.job} was deleted"
            cmds = self._end(rec, OpStatus.CANCELLED, now, f"{why} while it ran")
        else:
            error = e.outcome.error
            if dep is not None and dep.status is DeploymentStatus.FAILED:
                error = f"{dep.id} failed: {dep.error}"  # (a checkpoint of its dropped state)
            cmds = self._end(rec, OpStatus.FAILED, now, error)
        if e.op_id in self._side:  # a checkpoint of offloaded state: no flow
            del self._side[e.op_id]
            if isinstance(e.outcome, ev.Ok):
                self.counts["offloaded_checkpoints"] += 1
            return cmds
        flow = next(f for f in self._flows.values() if f.step == e.op_id)
        flow.step = None
        if isinstance(e.outcome, ev.Ok):
            return cmds + self._succeeded(flow, now)
        out = e.outcome
        flow.failed, flow.pending, flow.no_room = e.op_id, out.pending, out.no_room
        if out.broken:
            return cmds + self._judged(flow, out.error, now)
        if out.pending and not (dep is not None and dep.deleting):
            # a rank raised: the others may be stuck in a collective for it
            flow.waiting = ("settle", rec.deployment)
            return [*cmds, ev.Settle(rec.deployment, self.settings.settle_s)]
        return cmds + self._judged(flow, None, now)

    def _settled(self, e: ev.Settled, now: float) -> list[ev.Command]:
        flow = next(f for f in self._flows.values() if f.waiting == ("settle", e.dep))
        flow.waiting = None
        broken = None
        if not e.ok:
            broken = (
                f"{self._failed_error(flow)}; ranks {sorted(flow.pending)} were still in it "
                f"{self.settings.settle_s:g} s later"
            )
        return self._judged(flow, broken, now)

    def _failed_error(self, flow: Flow) -> str:
        rec = self.ops.get(flow.failed) if flow.failed is not None else None
        return (rec.error if rec is not None else None) or "it failed"

    def _succeeded(self, flow: Flow, now: float) -> list[ev.Command]:
        sched = self.groups[flow.group]
        if flow.stage is Stage.PARK:
            if sched.resident == flow.dep:
                sched.resident = None
            return self._finish(flow, now)
        if flow.stage is Stage.OFFLOAD:
            sched.resident = None
            flow.stage = Stage.LOAD
            return self._load(flow, now)
        if flow.stage is Stage.LOAD:
            sched.resident = flow.dep
            took = now - flow.switch_t0
            self._learn_switch(flow.dep, took)
            assert flow.op_id is not None
            self.ops[flow.op_id].setup_s = took
            self.counts["switches"] += 1
            return self._run(flow, now)
        return self._finish(flow, now)

    def _judged(self, flow: Flow, broken: str | None, now: float) -> list[ev.Command]:
        """A step of `flow` failed; `broken`: why its worker group must be torn down, if it
        must (None: the group holds what it held and goes on)."""
        error = self._failed_error(flow)
        sched = self.groups[flow.group]
        if flow.stage is Stage.RUN:
            dep = self.deployments.get(flow.dep)
            if broken is not None and dep is not None and not dep.deleting:
                return self._recover(flow.dep, broken, now, flow)
            return self._finish(flow, now)
        if flow.stage is Stage.PARK:
            flow.why = (
                f"offload of {flow.dep}: {broken}"
                if broken is not None
                else f"offload of {flow.dep} failed: {error}"
            )
            if broken is not None and flow.recover:
                why = f"its offload (to move it) failed: {flow.why}"
                return self._recover(flow.dep, why, now, flow)
            return self._finish(flow, now)
        if flow.stage is Stage.OFFLOAD:
            assert flow.old is not None
            old = self._live(flow.old)
            if flow.no_room and broken is None and old is not None:
                # the node has no room for its state: it stays resident, and the switch waits
                sched.resident = flow.old
                why = f"the switch to {flow.dep} failed: offload of {flow.old} failed: {error}"
                return self._fail_op(flow, why, now)
            # NOTE: a resident job whose offload fails is torn down (restarted from its state
            # if the node holds it whole, else failed): its failure never holds up the switch
            why = f"its offload for the switch to {flow.dep} failed: offload of {flow.old}: "
            return self._recover(flow.old, why + (broken or error), now, flow)
        # LOAD
        dep = self.deployments[flow.dep]
        if broken is not None:
            flow.why = f"load of {flow.dep}: {broken}"
            if not dep.deleting:
                return self._recover(flow.dep, f"its load failed: {flow.why}", now, flow)
            return self._load_gave_up(flow, now)
        flow.why = f"the switch to {flow.dep} failed: load of {flow.dep} failed: {error}"
        return self._load_gave_up(flow, now)

    def _after_recovery(self, flow: Flow, restarted: bool, now: float) -> list[ev.Command]:
        if flow.stage is Stage.OFFLOAD:  # the old job is out of the way either way
            self.groups[flow.group].resident = None
            flow.stage = Stage.LOAD
            return self._load(flow, now)
        if flow.stage is Stage.LOAD:
            if restarted and flow.tries < 2:  # a second try from its offloaded state
                return self._load(flow, now)
            return self._load_gave_up(flow, now)
        return self._finish(flow, now)

    def _load_gave_up(self, flow: Flow, now: float) -> list[ev.Command]:
        dep = self.deployments[flow.dep]
        if dep.deleting:
            assert flow.op_id is not None
            rec = self.ops[flow.op_id]
            return self._end(rec, OpStatus.CANCELLED, now, f"job {dep.job} was deleted") + (
                self._finish(flow, now)
            )
        return self._fail_op(flow, f"{dep.id} failed: {dep.error}" if dep.error else flow.why, now)

    def _fail_op(self, flow: Flow, error: str, now: float) -> list[ev.Command]:
        assert flow.op_id is not None
        rec = self.ops[flow.op_id]
        cmds: list[ev.Command] = []
        if not rec.status.terminal:
            cmds = self._end(rec, OpStatus.FAILED, now, error)
        return cmds + self._finish(flow, now)

    def _finish(self, flow: Flow, now: float) -> list[ev.Command]:
        del self._flows[flow.group]
        if flow.op_id is None:  # a park
            error = flow.why or None
            return [ev.ParkEnded(flow.dep, error)]
        return self._done(flow.group, flow.op_id, now)

    def _done(self, group: int, op_id: int, now: float) -> list[ev.Command]:
        self.groups[group].done(op_id)
        return self._pump(group, now)

    # ---- park: an idle deployment waits offloaded ---------------------------------------------
    def _park(self, e: ev.Park, now: float) -> list[ev.Command]:
        dep = self.deployments[e.dep]
        assert dep.group not in self._flows, f"group {dep.group} runs a flow already"
        flow = Flow(dep.group, dep.id, None, Stage.PARK, recover=e.recover)
        self._flows[dep.group] = flow
        if self.groups[dep.group].resident != dep.id and e.recover:  # (nothing to offload)
            return self._finish(flow, now)
        return self._step(flow, dep, "offload", now)

    # ---- recovery ----------------------------------------------------------------------------
    def _recover(
        self, dep_id: str, reason: str, now: float, flow: Flow | None = None
    ) -> list[ev.Command]:
        """Tear `dep_id`'s worker group down and, as the recovery policy decides, start it
        again with its state waiting on the node's sidecar, or fail it. What waits on it
        (`flow`) goes on when it is decided."""
        dep = self.deployments.get(dep_id)
        if dep is None or dep.deleting or self.closing or dep.status is not DeploymentStatus.READY:
            return [] if flow is None else self._after_recovery(flow, False, now)
        dep.move(DeploymentStatus.RECOVERING)
        self._reasons[dep_id] = reason
        if flow is not None:
            flow.waiting = ("recover", dep_id)
        sched = self.groups[dep.group]
        if sched.resident == dep_id:
            sched.resident = None
        return [ev.Teardown(dep_id, reason)]

    def _torn_down(self, e: ev.TornDown, now: float) -> list[ev.Command]:
        dep = self.deployments[e.dep]
        decision = self.settings.recovery.decide(
            reason=self._reasons[dep.id], state_intact=e.state_intact, restarts=dep.restarts
        )
        if decision.action is RecoveryAction.RESTART:
            return [ev.Restart(dep.id)]
        return [ev.Close(dep.id), *self._fail_deployment(dep, decision.reason, now)]

    def _restarted(self, e: ev.Restarted, now: float) -> list[ev.Command]:
        dep = self.deployments[e.dep]
        if e.error is not None:
            reason = f"{self._reasons[dep.id]}; its restart failed: {e.error}"
            return [ev.Close(dep.id), *self._fail_deployment(dep, reason, now)]
        dep.move(DeploymentStatus.READY)
        del self._reasons[dep.id]
        dep.restarts += 1
        self.counts["restarts"] += 1
        return self._recovered(dep.id, True, now)

    def _fail_deployment(self, dep: Deployment, reason: str, now: float) -> list[ev.Command]:
        dep.move(DeploymentStatus.FAILED)
        dep.error = reason
        self._reasons.pop(dep.id, None)
        sched = self.groups[dep.group]
        cmds: list[ev.Command] = []
        for op in sched.withdraw(dep.id):
            cmds += self._end(
                self.ops[op.op_id], OpStatus.FAILED, now, f"{dep.id} failed: {reason}"
            )
        if sched.resident == dep.id:
            sched.resident = None
        self.release(dep.id)
        self.counts["failed_deployments"] += 1
        return cmds + self._recovered(dep.id, False, now)

    def _recovered(self, dep_id: str, restarted: bool, now: float) -> list[ev.Command]:
        flow = next((f for f in self._flows.values() if f.waiting == ("recover", dep_id)), None)
        if flow is None:  # (the watchdog's or a lost node's recovery: nothing waits on it)
            return []
        flow.waiting = None
        return self._after_recovery(flow, restarted, now)

    def _rank_died(self, e: ev.RankDied, now: float) -> list[ev.Command]:
        dep = self.deployments.get(e.dep)
        if dep is None or dep.migrating or dep.status is not DeploymentStatus.READY:
            return []
        return self._recover(dep.id, e.why, now)

    def _node_lost(self, e: ev.NodeLost, now: float) -> list[ev.Command]:
        cmds: list[ev.Command] = []
        for dep in [d for d in self.deployments.values() if d.group == e.group]:
            if dep.status is DeploymentStatus.READY and not dep.deleting:
                cmds += self._recover(dep.id, e.why, now)
        self._plans[e.group] = []
        return [*cmds, ev.ForgetNode(e.group)]

    # ---- deletion and shutdown ---------------------------------------------------------------
    def _delete(self, e: ev.DeleteJob, now: float) -> list[ev.Command]:
        gone = [d for d in self.deployments.values() if d.job == e.job]
        if not gone:
            raise NotFound(f"no deployment of job {e.job!r}")
        if any(d.migrating for d in gone):
            raise Conflict(f"a deployment of {e.job} is moving: delete it when it has landed")
        cmds: list[ev.Command] = []
        for dep in gone:
            dep.deleting = True
            sched = self.groups[dep.group]
            for op in sched.withdraw(dep.id):
                cmds += self._end(
                    self.ops[op.op_id], OpStatus.CANCELLED, now, f"job {e.job} was deleted"
                )
            if sched.running is not None and sched.running.job == dep.id:
                cmds.append(ev.Kill(dep.id))
        return cmds

    def _forget(self, e: ev.Forget, now: float) -> list[ev.Command]:
        dep = self.deployments.pop(e.dep)
        sched = self.groups[dep.group]
        if sched.resident == dep.id:
            sched.resident = None
        self.release(dep.id)
        return [ev.Close(dep.id)]

    def _shutdown(self, e: ev.Shutdown, now: float) -> list[ev.Command]:
        self.closing = True
        cmds: list[ev.Command] = []
        for s in self.groups:
            for dep_id in {o.job for o in s.queue}:
                for op in s.withdraw(dep_id):
                    cmds += self._end(
                        self.ops[op.op_id], OpStatus.CANCELLED, now, "the service stopped"
                    )
        return cmds

    # ---- records and estimates ---------------------------------------------------------------
    def _end(
        self, rec: OpRecord, status: OpStatus, now: float, error: str | None = None
    ) -> list[ev.Command]:
        rec.move(status)
        rec.error, rec.ended_s = error, now
        if status is OpStatus.FAILED:
            self.counts["failed"] += 1
        self._finished.append(rec.op_id)
        while len(self._finished) > self.settings.retain_ops:  # bounded: what a finished op leaves
            self.ops.pop(self._finished.popleft(), None)
            self.forgotten += 1
        return [ev.Ended(rec.op_id)]

    def _learn(self, key: tuple[str, str], took: float) -> None:
        for seen in (self._exec, self._measured):
            old = seen.get(key)
            seen[key] = took if old is None else EWMA * took + (1 - EWMA) * old

    def _learn_switch(self, dep_id: str, took: float) -> None:
        old = self._switch.get(dep_id)
        self._switch[dep_id] = took if old is None else EWMA * took + (1 - EWMA) * old

    def _setup_estimate(self, job: str, resident: str | None) -> float:
        return self._switch.get(job, self.settings.default_switch_s)

    _HANDLERS: ClassVar[dict[type, Callable[..., list[ev.Command]]]] = {
        ev.Submit: _submit,
        ev.Turn: _turn,
        ev.Park: _park,
        ev.StepEnded: _step_ended,
        ev.Settled: _settled,
        ev.TornDown: _torn_down,
        ev.Restarted: _restarted,
        ev.RankDied: _rank_died,
        ev.NodeLost: _node_lost,
        ev.DeleteJob: _delete,
        ev.Forget: _forget,
        ev.Shutdown: _shutdown,
    }
