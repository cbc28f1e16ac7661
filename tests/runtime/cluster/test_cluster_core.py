"""The cluster service's core on a fake clock, with no processes and no sleeps: under any
interleaving of submissions, ranks that raise, die or wedge, refusals, deletions, lost nodes and
shutdown, every operation ends exactly once, the transition tables hold, one flow runs per node
group, and no job's failure reaches another job's operation."""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loom.cluster.faults import RecoveryPolicy
from loom.core.errors import Conflict, NotFound
from loom.runtime.cluster import events as ev
from loom.runtime.cluster.core import ClusterCore, CoreSettings
from loom.runtime.cluster.records import (
    DEPLOYMENT_TRANSITIONS,
    OP_TRANSITIONS,
    Deployment,
    DeploymentStatus,
    IllegalTransition,
    OpRecord,
    OpStatus,
)

C = TypeVar("C", bound=ev.Command)
KINDS = ("forward", "forward_backward", "optim_step", "save_ckpt")
OUTCOMES = ("ok", "ok", "ok", "refused", "raises", "wedged", "no_room")


@dataclass
class Group:
    """A fake worker group: alive or not, and closed once its deployment is done with."""

    alive: bool = True
    closed: bool = False


@dataclass
class World:
    """A fake driver: it carries out the core's commands as the real one does, one session of
    commands per node group at a time, with outcomes drawn by hypothesis."""

    core: ClusterCore
    data: st.DataObject
    now: float = 0.0
    wpgs: dict[str, Group] = field(default_factory=dict)
    sessions: dict[int, deque[ev.Command]] = field(default_factory=dict)  # group -> todo
    session_op: dict[int, int | None] = field(default_factory=dict)  # group -> its operation
    turns: dict[int, deque[int]] = field(default_factory=lambda: defaultdict(deque))
    ended: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    accepted: list[int] = field(default_factory=list)
    flow_runs: dict[int, list[tuple[str, str, str]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    side: deque[ev.Checkpoint] = field(default_factory=deque)
    deleted_jobs: set[str] = field(default_factory=set)
    forget: list[str] = field(default_factory=list)  # deleted, waiting for their op to end
    failed_deps: set[str] = field(default_factory=set)
    outcomes: dict[int, str] = field(default_factory=dict)  # a step's record -> its outcome

    def handle(self, event: ev.Event) -> list[ev.Command]:
        self.now += self.data.draw(st.floats(0.0, 2.0), label="dt")
        cmds = self.core.handle(event, self.now)
        for d in self.core.deployments.values():
            if d.status is DeploymentStatus.FAILED:
                self.failed_deps.add(d.id)
        return cmds

    def outside(self, cmds: list[ev.Command]) -> None:
        """Commands of an event no session caused: wake-ups and new work now, the rest (kills,
        closes) at once, as the driver does."""
        for cmd in cmds:
            if isinstance(cmd, ev.Ended):
                self.ended[cmd.op_id] += 1
            elif isinstance(cmd, ev.Dispatch):
                self.turns[cmd.group].append(cmd.op_id)
            elif isinstance(cmd, ev.Checkpoint):
                self.side.append(cmd)
            elif isinstance(cmd, ev.Accepted):
                self.accepted.append(cmd.op_id)
            elif isinstance(cmd, ev.Kill):
                self.wpgs[cmd.dep].alive = False
            elif isinstance(cmd, ev.Close):
                self.wpgs[cmd.dep].alive, self.wpgs[cmd.dep].closed = False, True
            else:
                raise AssertionError(f"outside a session: {cmd!r}")

    def open(self, group: int, event: ev.Event, op_id: int | None = None) -> None:
        assert group not in self.sessions
        self.sessions[group] = deque()
        self.session_op[group] = op_id
        self.feed(group, self.handle(event))

    def feed(self, group: int, cmds: list[ev.Command]) -> None:
        self.sessions[group].extendleft(reversed(cmds))
        if not self.sessions[group]:
            del self.sessions[group]

    def step(self, group: int) -> None:
        """Carry out one command of `group`'s session."""
        todo = self.sessions[group]
        cmd = todo.popleft()
        event = self.carry_out(cmd, self.session_op[group])
        if event is not None:
            todo.extendleft(reversed(self.handle(event)))
        if not todo:
            del self.sessions[group]

    def carry_out(self, cmd: ev.Command, op_id: int | None) -> ev.Event | None:
        draw = self.data.draw
        if isinstance(cmd, ev.Run | ev.Settle | ev.Teardown | ev.Restart | ev.Checkpoint):
            # the core forgets a deployment only once nothing it decided still touches it
            assert not self.wpgs[cmd.dep].closed, f"{cmd!r} on a closed worker group"
        if isinstance(cmd, ev.Run):
            outcome = "dead" if not self.wpgs[cmd.dep].alive else draw(st.sampled_from(OUTCOMES))
            self.outcomes[cmd.op_id] = outcome
            if op_id is not None:
                self.flow_runs[op_id].append((cmd.dep, cmd.kind, outcome))
            if outcome == "ok":
                return ev.StepEnded(cmd.op_id, ev.Ok({"ok": True}, 0.5))
            if outcome in ("refused", "no_room"):
                failed = ev.Failed(f"{cmd.dep}: {outcome}", no_room=outcome == "no_room")
                return ev.StepEnded(cmd.op_id, failed)
            if outcome == "raises":
                return ev.StepEnded(cmd.op_id, ev.Failed(f"{cmd.dep} raised", pending=(1,)))
            if outcome == "wedged":
                self.wpgs[cmd.dep].alive = False  # (the real group kills it at the deadline)
                error = f"{cmd.dep}: ran past its deadline of {cmd.deadline_s:g} s"
                return ev.StepEnded(cmd.op_id, ev.Failed(error, broken=True))
            return ev.StepEnded(cmd.op_id, ev.Failed(f"{cmd.dep}: rank 0 died", broken=True))
        if isinstance(cmd, ev.Settle):
            return ev.Settled(cmd.dep, draw(st.booleans(), label="settles"))
        if isinstance(cmd, ev.Teardown):
            self.wpgs[cmd.dep].alive = False
            return ev.TornDown(cmd.dep, draw(st.booleans(), label="intact"))
        if isinstance(cmd, ev.Restart):
            if draw(st.booleans(), label="restarts"):
                self.wpgs[cmd.dep] = Group()
                return ev.Restarted(cmd.dep)
            return ev.Restarted(cmd.dep, "no room to start it")
        if isinstance(cmd, ev.Hint | ev.ParkEnded | ev.ForgetNode):
            return None
        self.outside([cmd])
        return None

    # ---- what a user and the machine do ------------------------------------------------------
    def create(self, dep_id: str, group: int) -> None:
        job = dep_id.split(":")[0]
        self.wpgs[dep_id] = Group()
        if self.core.add(Deployment(dep_id, job, group)):
            self.open(group, ev.Park(dep_id))
            while group in self.sessions:
                self.step(group)

    def act(self) -> None:
        core, draw = self.core, self.data.draw
        choices = ["submit", "submit", "step", "step", "step", "turn", "die", "delete"]
        choices += ["side", "node", "forget"]
        what = draw(st.sampled_from(choices), label="action")
        deps = sorted(core.deployments)
        if what == "submit" and deps:
            dep = draw(st.sampled_from(deps))
            kind = draw(st.sampled_from(KINDS))
            try:
                self.outside(self.handle(ev.Submit(dep, kind, {"path": "/ckpt"})))
            except (NotFound, Conflict):
                assert core.deployments[dep].deleting or dep in self.failed_deps
        elif what == "step" and self.sessions:
            self.step(draw(st.sampled_from(sorted(self.sessions))))
        elif what == "turn":
            free = [g for g, q in self.turns.items() if q and g not in self.sessions]
            if free:
                g = draw(st.sampled_from(free))
                op_id = self.turns[g].popleft()
                self.open(g, ev.Turn(g, op_id), op_id)
        elif what == "die" and deps:
            dep = draw(st.sampled_from(deps))
            self.wpgs[dep].alive = False
            g = core.deployments[dep].group
            if g not in self.sessions and not core.running_on(dep):  # the watchdog sees it
                self.open(g, ev.RankDied(dep, f"{dep}: rank 0 exited (1)"))
        elif what == "node":
            g = draw(st.sampled_from([0, 1]))
            if g not in self.sessions and not any(
                core.running_on(d) for d in deps if core.deployments[d].group == g
            ):
                self.open(g, ev.NodeLost(g, f"node {g}'s sidecar died"))
        elif what == "delete" and deps:
            job = draw(st.sampled_from(sorted({d.split(":")[0] for d in deps})))
            if job in self.deleted_jobs:
                return
            self.deleted_jobs.add(job)
            self.outside(self.handle(ev.DeleteJob(job)))
            self.forget += [d for d in deps if d.startswith(f"{job}:")]
        elif what == "forget":  # as the driver's delete: once the core is done with it
            for dep in list(self.forget):
                if not core.in_use(dep):
                    self.forget.remove(dep)
                    self.outside(self.handle(ev.Forget(dep)))
        elif what == "side" and self.side:
            cmd = self.side.popleft()
            self.wpgs.setdefault(cmd.dep, Group())
            closed = self.wpgs[cmd.dep].closed  # (its deployment failed: its state is dropped)
            assert not closed or cmd.dep in self.failed_deps, f"{cmd!r} on a closed worker group"
            ok = not closed and draw(st.booleans(), label="checkpoint ok")
            out: ev.Outcome = ev.Ok({"path": cmd.path}, 0.1) if ok else ev.Failed("no state")
            self.outside(self.handle(ev.StepEnded(cmd.op_id, out)))

    def drain(self) -> None:
        """Shutdown: queued operations are cancelled; running ones finish or are killed."""
        self.outside(self.handle(ev.Shutdown()))
        for _ in range(10_000):
            if self.sessions:
                self.step(min(self.sessions))
            elif any(self.turns.values()):
                g = next(g for g, q in self.turns.items() if q)
                op_id = self.turns[g].popleft()
                self.open(g, ev.Turn(g, op_id), op_id)
            elif self.side:
                cmd = self.side.popleft()
                self.outside(self.handle(ev.StepEnded(cmd.op_id, ev.Failed("stopped"))))
            else:
                return
        raise AssertionError("the service never came to rest")


def only(kind: type[C], cmds: list[ev.Command]) -> list[C]:
    return [c for c in cmds if isinstance(c, kind)]


def make_core(retain_ops: int = 10_000) -> ClusterCore:
    return ClusterCore(
        CoreSettings(
            groups=2,
            known_ops=KINDS,
            settle_s=3.0,
            retain_ops=retain_ops,
            recovery=RecoveryPolicy(max_restarts=2),
        )
    )


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_every_operation_ends_once_and_no_failure_crosses_jobs(data: st.DataObject) -> None:
    core = make_core()
    w = World(core, data)
    for dep_id, group in [("a:actor", 0), ("b:actor", 0), ("c:actor", 1), ("d:actor", 1)]:
        w.create(dep_id, group)
    for _ in range(data.draw(st.integers(10, 80), label="actions")):
        w.act()
        assert sum(1 for s in core.groups if s.running is not None) <= len(core.groups)
    w.drain()
    everything = set(w.accepted) | {r.op_id for r in core.ops.values()}
    for op_id in everything:
        rec = core.ops[op_id]
        assert rec.status.terminal, f"{op_id} never ended: {rec}"
        assert w.ended[op_id] == 1, f"{op_id} ended {w.ended[op_id]} times"
    for s in core.groups:
        assert s.running is None and not s.queue
    failed = [r for r in core.ops.values() if r.status is OpStatus.FAILED]
    assert core.counts["failed"] == len(failed)  # the count a user reads in /v1/stats
    for rec in failed:  # an offload or load failed only as it was made to
        assert not rec.system or w.outcomes[rec.op_id] != "ok", rec
    for op_id in w.accepted:
        rec = core.ops[op_id]
        job = rec.job
        if rec.status is OpStatus.CANCELLED:
            assert job in w.deleted_jobs or core.closing, rec
        if rec.status is not OpStatus.FAILED:
            continue
        own = [o for dep, _, o in w.flow_runs[op_id] if dep == rec.deployment and o != "ok"]
        room = [o for _, kind, o in w.flow_runs[op_id] if kind == "offload" and o == "no_room"]
        side = rec.kind == "save_ckpt" and not w.flow_runs[op_id]  # a checkpoint of state held
        assert own or room or side or rec.deployment in w.failed_deps, (
            f"{rec.deployment}'s operation {op_id} failed for another job: {rec.error}"
        )


def test_an_operation_moves_only_as_its_table_allows() -> None:
    rec = OpRecord(0, "a:actor", "a", "forward", {}, 0.0)
    with pytest.raises(IllegalTransition, match="queued -> succeeded"):
        rec.move(OpStatus.SUCCEEDED)
    rec.move(OpStatus.RUNNING)
    rec.move(OpStatus.FAILED)
    for to in OpStatus:
        with pytest.raises(IllegalTransition):
            rec.move(to)
    assert {s for s in OpStatus if s.terminal} == {
        OpStatus.SUCCEEDED,
        OpStatus.FAILED,
        OpStatus.CANCELLED,
    }
    assert set(OP_TRANSITIONS) == set(OpStatus)
    dep = Deployment("a:actor", "a", 0)
    with pytest.raises(IllegalTransition, match="ready -> failed"):
        dep.move(DeploymentStatus.FAILED)  # (only a recovery decides that)
    assert set(DEPLOYMENT_TRANSITIONS) == set(DeploymentStatus)


def test_a_switch_offloads_the_resident_job_then_loads_the_next() -> None:
    core = make_core()
    core.add(Deployment("a:actor", "a", 0))
    assert core.add(Deployment("b:actor", "b", 0))  # waits offloaded
    run = core.handle(ev.Park("b:actor"), 0.0)
    assert [type(c) for c in run] == [ev.Run] and run[0].kind == "offload"  # type: ignore[attr-defined]
    assert core.handle(ev.StepEnded(run[0].op_id, ev.Ok(None, 0.2)), 0.2)[-1] == ev.ParkEnded(  # type: ignore[attr-defined]
        "b:actor"
    )
    cmds = core.handle(ev.Submit("b:actor", "forward", {}), 1.0)
    accepted, dispatch = cmds
    assert isinstance(accepted, ev.Accepted) and isinstance(dispatch, ev.Dispatch)
    steps = core.handle(ev.Turn(0, accepted.op_id), 1.0)
    kinds = []
    while steps:
        run = [c for c in steps if isinstance(c, ev.Run)]
        if not run:
            break
        kinds.append((run[0].dep, run[0].kind))
        steps = core.handle(ev.StepEnded(run[0].op_id, ev.Ok({}, 0.5)), 2.0)
    assert kinds == [("a:actor", "offload"), ("b:actor", "load"), ("b:actor", "forward")]
    assert core.ops[accepted.op_id].status is OpStatus.SUCCEEDED
    assert core.ops[accepted.op_id].setup_s == pytest.approx(1.0)
    assert core.groups[0].resident == "b:actor" and core.counts["switches"] == 1


def test_a_rank_that_raises_and_never_settles_tears_its_group_down_and_restarts_it() -> None:
    core = make_core()
    core.add(Deployment("a:actor", "a", 0))
    _, dispatch = core.handle(ev.Submit("a:actor", "forward", {}), 0.0)
    queued = core.handle(ev.Submit("a:actor", "forward", {}), 0.0)[0]
    assert isinstance(dispatch, ev.Dispatch) and isinstance(queued, ev.Accepted)
    (run,) = only(ev.Run, core.handle(ev.Turn(0, dispatch.op_id), 0.0))
    settle = core.handle(ev.StepEnded(run.op_id, ev.Failed("rank 1 raised", pending=(0,))), 1.0)
    assert settle == [ev.Ended(run.op_id), ev.Settle("a:actor", 3.0)]
    (teardown,) = core.handle(ev.Settled("a:actor", False), 4.0)
    assert isinstance(teardown, ev.Teardown) and "ranks [0] were still in it 3 s later" in (
        teardown.reason
    )
    assert core.deployments["a:actor"].status is DeploymentStatus.RECOVERING
    assert core.handle(ev.TornDown("a:actor", state_intact=True), 5.0) == [ev.Restart("a:actor")]
    after = core.handle(ev.Restarted("a:actor"), 6.0)
    assert after == [ev.Dispatch(0, queued.op_id)]  # the next operation goes on
    assert core.deployments["a:actor"].restarts == 1
    assert core.ops[run.op_id].status is OpStatus.FAILED


def test_a_deployment_that_cannot_restart_fails_its_queued_operations_alone() -> None:
    core = make_core()
    core.add(Deployment("a:actor", "a", 0))
    core.add(Deployment("c:actor", "c", 1))
    _, dispatch = core.handle(ev.Submit("a:actor", "forward", {}), 0.0)
    queued = core.handle(ev.Submit("a:actor", "forward", {}), 0.0)[0]
    other = core.handle(ev.Submit("c:actor", "forward", {}), 0.0)[0]
    assert isinstance(dispatch, ev.Dispatch)
    (run,) = only(ev.Run, core.handle(ev.Turn(0, dispatch.op_id), 0.0))
    core.handle(ev.StepEnded(run.op_id, ev.Failed("rank 0 exited (13)", broken=True)), 1.0)
    cmds = core.handle(ev.TornDown("a:actor", state_intact=False), 2.0)
    assert ev.Close("a:actor") in cmds
    dep = core.deployments["a:actor"]
    assert dep.status is DeploymentStatus.FAILED and "rank 0 exited (13)" in (dep.error or "")
    assert isinstance(queued, ev.Accepted) and isinstance(other, ev.Accepted)
    assert core.ops[queued.op_id].status is OpStatus.FAILED
    assert (
        core.ops[other.op_id].status is OpStatus.RUNNING
        or not core.ops[other.op_id].status.terminal
    )
    with pytest.raises(Conflict, match="Delete job a"):
        core.handle(ev.Submit("a:actor", "forward", {}), 3.0)


def test_finished_operations_beyond_retain_ops_are_forgotten() -> None:
    core = make_core(retain_ops=2)
    core.add(Deployment("a:actor", "a", 0))
    ids = []
    for t in range(4):
        _, dispatch = core.handle(ev.Submit("a:actor", "forward", {}), float(t))
        assert isinstance(dispatch, ev.Dispatch)
        (run,) = only(ev.Run, core.handle(ev.Turn(0, dispatch.op_id), float(t)))
        core.handle(ev.StepEnded(run.op_id, ev.Ok({}, 0.1)), t + 0.5)
        ids.append(dispatch.op_id)
    assert [i for i in ids if i in core.ops] == ids[-2:] and core.forgotten == 2


def switch_to_b(core: ClusterCore, offload: ev.Failed) -> tuple[int, list[ev.Command]]:
    """b's operation's turn on a group where a is resident; a's offload ends with `offload`."""
    core.add(Deployment("a:actor", "a", 0))
    core.add(Deployment("b:actor", "b", 0))
    core.groups[0].resident = "a:actor"
    _, dispatch = core.handle(ev.Submit("b:actor", "forward", {}), 0.0)
    assert isinstance(dispatch, ev.Dispatch)
    (run,) = only(ev.Run, core.handle(ev.Turn(0, dispatch.op_id), 0.0))
    assert (run.dep, run.kind) == ("a:actor", "offload")
    return dispatch.op_id, core.handle(ev.StepEnded(run.op_id, offload), 1.0)


def test_a_resident_job_whose_offload_raises_is_torn_down_and_the_switch_goes_on() -> None:
    core = make_core()
    op_id, cmds = switch_to_b(core, ev.Failed("a's rank 0 raised: MemoryError"))
    (teardown,) = only(ev.Teardown, cmds)
    assert teardown.dep == "a:actor" and "its offload for the switch to b:actor" in (
        teardown.reason
    )
    cmds = core.handle(ev.TornDown("a:actor", state_intact=False), 2.0)  # its state was on it
    assert core.deployments["a:actor"].status is DeploymentStatus.FAILED
    (load,) = only(ev.Run, cmds)
    assert (load.dep, load.kind) == ("b:actor", "load")  # b's switch goes on
    (run,) = only(ev.Run, core.handle(ev.StepEnded(load.op_id, ev.Ok({}, 0.5)), 3.0))
    core.handle(ev.StepEnded(run.op_id, ev.Ok({"loss": 1.0}, 0.5)), 4.0)
    assert core.ops[op_id].status is OpStatus.SUCCEEDED


def test_a_node_with_no_room_keeps_the_resident_job_and_fails_the_switch() -> None:
    core = make_core()
    op_id, _ = switch_to_b(core, ev.Failed("TierFull: no room on host", no_room=True))
    assert core.ops[op_id].status is OpStatus.FAILED
    assert "the switch to b:actor failed" in (core.ops[op_id].error or "")
    assert core.groups[0].resident == "a:actor"
    assert core.deployments["a:actor"].status is DeploymentStatus.READY
