"""The cluster service's driver (PlexRL §4.1, §5.1–5.2): deployments on node groups, each one a
worker-process group; jobs' operations admitted by one `GroupScheduler` per node group under an
operation policy (HRRS by default) and forwarded to the deployment's WPG when admitted, one at
a time per group. On a job change the driver first offloads the resident deployment's state
and loads the next one's (§5.2.2), as operations of their own in the records.

Each node group is a node with its own StateManager sidecar (`loom.state.sidecar`, started
with the group's first deployment): every deployment on the group moves its state through it.
The driver tells the sidecar the group's plan after each decision (eviction follows it) and
asks it to prefetch the next job it will switch to while the current one runs (§4.5.1). A
checkpoint of a deployment that is offloaded and idle is materialised by the sidecar from the
managed state without a switch (§4.5.3), while other jobs run on the group. Moving a deployment
to another group (`migrate`, or a repack that picks another group) offloads it, mirrors its
state to the new node's sidecar and starts its ranks there with their state waiting.

The decisions are `core.ClusterCore`'s (`handle(event, now) -> commands`); this driver turns
requests, worker-group replies and its watchdog into events and carries out the commands, one
flow of steps per node group at a time (under the group's lock). A WPG call blocks, so it runs
in a thread. Every accepted operation reaches a terminal state: succeeded, failed (its error
says why), or cancelled when its job is deleted or the service stops.

No operation runs forever and no broken deployment holds up another. Each operation runs
under a deadline (`DeadlinePolicy`: a multiple of its measured or profiled duration, with a
floor; a caller may name its own). It fails at the first rank that raises; ranks that do not
settle soon after, a rank that dies and an operation past its deadline mean the worker group
is torn down (its processes killed). Then `RecoveryPolicy` decides: a group whose state the
node's sidecar holds whole (offloaded, not loaded since) is started again with that state
waiting; any other fails its deployment with the reason, its queued operations with it. A
failed or deleted deployment is skipped by its group's scheduler: a switch away from it drops
its state instead of asking its ranks to offload. A watchdog finds ranks that die while idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loom.cluster.faults import DeadlinePolicy, RecoveryPolicy
from loom.cluster.plexrl.group import GroupScheduler
from loom.cluster.plexrl.hrrs import OpPolicyKind
from loom.cluster.plexrl.timeline import Footprint
from loom.core.errors import ConfigError, Conflict, NotFound, Unavailable
from loom.runtime.cluster import events as ev
from loom.runtime.cluster.core import ClusterCore, CoreSettings
from loom.runtime.cluster.launchers import Launcher, make_launcher
from loom.runtime.cluster.models.ref import parse_model
from loom.runtime.cluster.payloads import FAULT_OP
from loom.runtime.cluster.records import Deployment, DeploymentStatus, OpRecord, OpStatus
from loom.runtime.cluster.wpg import (
    OPS,
    FailureKind,
    GroupBroken,
    RankFailed,
    WorkerError,
    WorkerGroupConfig,
    Workers,
)
from loom.state.sidecar import SidecarConfig, StateError

__all__ = [
    "ClusterDriver",
    "Conflict",
    "DeploymentStatus",
    "NotFound",
    "OpRecord",
    "OpStatus",
    "Served",
    "Unavailable",
]

log = logging.getLogger("loom.cluster")

USER_OPS = tuple(o for o in OPS if o not in ("offload", "load", FAULT_OP))


@dataclass
class Served:
    """A deployment as the driver holds it: the core's record and its worker group."""

    dep: Deployment
    wpg: Workers  # its worker group, however its ranks run
    model: str
    dp: int = 1
    seed: int = 0
    model_options: dict[str, Any] = field(default_factory=dict)
    # NOTE: its worker group's I/O (a state move, a teardown, an offloaded checkpoint, a
    # migration) one at a time
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    watched: bool = False  # the watchdog has a recovery of it under way

    @property
    def id(self) -> str:
        return self.dep.id

    def view(self) -> dict[str, Any]:
        dep, placed = self.dep, self.dep.placement
        return {
            "id": dep.id,
            "job": dep.job,
            "model": self.model,
            "role": dep.id.split(":", 1)[1],
            "status": dep.status.value,
            "error": dep.error,
            "restarts": dep.restarts,
            "group": dep.group,
            "dp": self.wpg.config.dp,
            "ops_run": self.wpg.ops_run,
            "pids": self.wpg.pids,  # worker processes here (none on Ray)
            "placement": None
            if placed is None
            else {
                "group": placed.group,
                "delta_s": placed.delta,
                "start_s": placed.start,
                "dedicated": placed.dedicated,
            },
        }


def _wpg_name(dep_id: str) -> str:
    """A deployment's worker group's name: its state's name on a node's sidecar too."""
    return dep_id.replace(":", "-")


class ClusterDriver:
    def __init__(
        self,
        *,
        groups: int = 1,
        policy: OpPolicyKind | str = OpPolicyKind.HRRS,
        state_dir: Path | None = None,
        default_exec_s: float = 1.0,
        default_switch_s: float = 1.0,
        launcher: Launcher | str = "process",
        gpus_per_rank: float = 0.0,
        gpus_per_group: int = 8,
        state: SidecarConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        deadlines: DeadlinePolicy | None = None,
        recovery: RecoveryPolicy | None = None,
        settle_s: float = 10.0,
        watch_s: float = 1.0,
        faults: bool = False,
        retain_ops: int = 10_000,
    ) -> None:
        """`launcher`: how worker groups start (`launchers`): "process" (worker processes on
        each group's sidecar, `state`, whose GPUs are `gpus_per_group`), "ray" (Ray actors of
        `gpus_per_rank` GPUs each), or a `Launcher` (tests put stand-ins there). `deadlines`
        and `recovery` decide how long an operation may run and what happens to a group torn
        down; `settle_s`: after a rank raised, how long the others have to answer before the
        group is torn down; `watch_s`: how often idle groups are checked for dead ranks;
        `faults`: accept the test-only `inject_fault` operation; `retain_ops`: finished
        operations remembered (with their results) for their callers to read, the oldest
        forgotten beyond it."""
        if gpus_per_group < 1:
            raise ConfigError(f"gpus_per_group must be >= 1, got {gpus_per_group}")
        self.core = ClusterCore(
            CoreSettings(
                groups=groups,
                policy=OpPolicyKind(policy),
                default_exec_s=default_exec_s,
                default_switch_s=default_switch_s,
                settle_s=settle_s,
                retain_ops=retain_ops,
                known_ops=USER_OPS + ((FAULT_OP,) if faults else ()),
                deadlines=deadlines or DeadlinePolicy(),
                recovery=recovery or RecoveryPolicy(),
            )
        )
        self.launcher = (
            launcher
            if isinstance(launcher, Launcher)
            else make_launcher(
                launcher,
                groups=groups,
                gpus_per_group=gpus_per_group,
                gpus_per_rank=gpus_per_rank,
                state=state or SidecarConfig(),
                state_dir=state_dir,
                on_node_lost=self._node_lost,
            )
        )
        self._migrating = asyncio.Lock()
        self.state_dir = state_dir
        self.clock = clock
        self._t0 = clock()
        self.served: dict[str, Served] = {}
        self._waiters: dict[int, asyncio.Event] = {}
        # NOTE: a group's devices hold one job's work at a time: every flow of steps on a
        # group (an operation's switch and run, a park, a recovery) runs under its lock
        self._locks = [asyncio.Lock() for _ in range(groups)]
        self._tasks: set[asyncio.Task[Any]] = set()
        self.settle_s, self.watch_s, self.faults = settle_s, watch_s, faults
        self._watchdog: asyncio.Task[None] | None = None
        self._nodes_lost: set[int] = set()  # groups whose dead sidecar is being dealt with
        self._prefetched = 0
        self._parked: dict[str, str | None] = {}  # a park's outcome, for whoever asked it

    def now(self) -> float:
        return self.clock() - self._t0

    # ---- what the core holds, read by the service and tests ----------------------------------
    @property
    def ops(self) -> dict[int, OpRecord]:
        return self.core.ops

    @property
    def groups(self) -> list[GroupScheduler]:
        return self.core.groups

    @property
    def deployments(self) -> dict[str, Served]:
        return self.served

    @property
    def forgotten(self) -> int:
        return self.core.forgotten

    @property
    def retain_ops(self) -> int:
        return self.core.settings.retain_ops

    @property
    def counts(self) -> dict[str, int]:
        return self.core.counts | {"prefetched_bytes": self._prefetched}

    # ---- carrying out the core's commands ----------------------------------------------------
    async def _carry_out(self, cmds: list[ev.Command]) -> None:
        """Carry out `cmds` in order; what a command's work ends in goes back to the core, and
        the commands it answers with run next (before the rest of the list)."""
        todo = deque(cmds)
        while todo:
            cmd = todo.popleft()
            event = await self._do(cmd)
            if event is not None:
                todo.extendleft(reversed(self.core.handle(event, self.now())))

    def _handle(self, event: ev.Event) -> list[ev.Command]:
        """An event that no flow on a group caused (a submission, a deletion, shutdown): the
        waiters it ends are woken and the work it starts runs in tasks of its own; the rest
        (its answer, ranks to kill) is returned for the caller to carry out."""
        rest: list[ev.Command] = []
        for cmd in self.core.handle(event, self.now()):
            if isinstance(cmd, ev.Ended):
                self._wake(cmd.op_id)
            elif isinstance(cmd, ev.Dispatch):
                self._spawn(self._turn(cmd.group, cmd.op_id))
            elif isinstance(cmd, ev.Checkpoint):
                self._spawn(self._carry_out([cmd]))
            else:
                rest.append(cmd)
        return rest

    def _wake(self, op_id: int) -> None:
        waiter = self._waiters.pop(op_id, None)
        if waiter is not None:
            waiter.set()

    async def _do(self, cmd: ev.Command) -> ev.Event | None:
        loop = asyncio.get_running_loop()
        if isinstance(cmd, ev.Ended):
            self._wake(cmd.op_id)
        elif isinstance(cmd, ev.Dispatch):
            self._spawn(self._turn(cmd.group, cmd.op_id))
        elif isinstance(cmd, ev.Run):
            return await self._run(cmd)
        elif isinstance(cmd, ev.Checkpoint):
            return await self._checkpoint(cmd)
        elif isinstance(cmd, ev.Settle):
            ok = await loop.run_in_executor(None, self.served[cmd.dep].wpg.settle, cmd.timeout_s)
            return ev.Settled(cmd.dep, ok)
        elif isinstance(cmd, ev.Teardown):
            s = self.served[cmd.dep]
            log.warning("tearing down %s's worker group: %s", cmd.dep, cmd.reason)
            async with s.lock:
                await loop.run_in_executor(None, s.wpg.kill)
                intact = await loop.run_in_executor(None, s.wpg.state_intact)
            return ev.TornDown(cmd.dep, intact)
        elif isinstance(cmd, ev.Restart):
            return await self._restart(self.served[cmd.dep])
        elif isinstance(cmd, ev.Close):
            s = self.served[cmd.dep]
            close = functools.partial(s.wpg.close, keep_state=cmd.keep_state)
            await loop.run_in_executor(None, close)
            if s.dep.status is DeploymentStatus.FAILED:
                log.error("deployment %s failed: %s", s.id, s.dep.error)
        elif isinstance(cmd, ev.Kill):
            await loop.run_in_executor(None, self.served[cmd.dep].wpg.kill)
        elif isinstance(cmd, ev.Hint):
            if cmd.kind == "prefetch":
                self._spawn(self._hint(cmd))  # (while the operation runs)
            else:
                await self._hint(cmd)
        elif isinstance(cmd, ev.ParkEnded):
            self._parked[cmd.dep] = cmd.error
        elif isinstance(cmd, ev.ForgetNode):
            await self.launcher.forget_node(cmd.group)
        else:  # ev.Accepted: the caller's answer, read where it was asked
            assert isinstance(cmd, ev.Accepted), f"no way to carry out {cmd!r}"
        return None

    async def _run(self, cmd: ev.Run) -> ev.Event:
        """Run an operation on a worker group within its deadline; how it ended."""
        s = self.served[cmd.dep]
        loop = asyncio.get_running_loop()
        t0 = self.clock()
        try:
            async with s.lock:
                result = await loop.run_in_executor(
                    None, s.wpg.run, cmd.kind, cmd.payload, cmd.deadline_s
                )
        except GroupBroken as exc:
            return ev.StepEnded(cmd.op_id, ev.Failed(str(exc), broken=True))
        except RankFailed as exc:
            pending, no_room = tuple(sorted(exc.pending)), exc.kind is FailureKind.NO_ROOM
            return ev.StepEnded(cmd.op_id, ev.Failed(str(exc), pending=pending, no_room=no_room))
        except (WorkerError, ConfigError) as exc:
            return ev.StepEnded(cmd.op_id, ev.Failed(str(exc)))
        except Exception as exc:  # every accepted operation ends, with what went wrong
            log.exception("%s %s", cmd.dep, cmd.kind)
            return ev.StepEnded(cmd.op_id, ev.Failed(f"{type(exc).__name__}: {exc}"))
        return ev.StepEnded(cmd.op_id, ev.Ok(result, self.clock() - t0))

    async def _checkpoint(self, cmd: ev.Checkpoint) -> ev.Event:
        """A checkpoint from the state the sidecar holds: no switch, the group runs on."""
        s = self.served[cmd.dep]
        loop = asyncio.get_running_loop()
        name = s.wpg.config.name
        t0 = self.clock()
        try:
            async with s.lock:
                out = await asyncio.wait_for(
                    loop.run_in_executor(
                        None, lambda: s.wpg.state("checkpoint", dep=name, path=cmd.path)
                    ),
                    cmd.deadline_s,
                )
        except TimeoutError:
            error = f"save_ckpt ran past its deadline of {cmd.deadline_s:g} s"
            return ev.StepEnded(cmd.op_id, ev.Failed(error))
        except (StateError, WorkerError) as exc:
            return ev.StepEnded(cmd.op_id, ev.Failed(str(exc)))
        meta = out[0].pop("meta", {})
        result = out[0] | {"step": meta.get("step"), "from": "offloaded state"}
        return ev.StepEnded(cmd.op_id, ev.Ok(result, self.clock() - t0))

    async def _restart(self, s: Served) -> ev.Event:
        """Start a torn-down deployment's worker group again with its state waiting."""
        loop = asyncio.get_running_loop()
        async with s.lock:
            try:
                wpg = await self._launch(s, s.dep.group, start_offloaded=True)
            except (WorkerError, StateError) as exc:
                return ev.Restarted(s.id, str(exc))
            old, s.wpg = s.wpg, wpg
            await loop.run_in_executor(None, functools.partial(old.close, keep_state=True))
        log.warning("%s started again from its offloaded state", s.id)
        return ev.Restarted(s.id)

    async def _hint(self, cmd: ev.Hint) -> None:
        """A hint to the StateManager of a deployment's node (§4.5.1). A hint that fails costs
        nothing but its benefit."""
        s = self.served.get(cmd.dep)
        if s is None:
            return
        loop = asyncio.get_running_loop()
        try:
            if cmd.kind == "plan":
                names = [self.served[d].wpg.config.name for d in cmd.upcoming if d in self.served]
                await loop.run_in_executor(None, lambda: s.wpg.state("plan", upcoming=names))
            elif not s.lock.locked():
                name = s.wpg.config.name
                moved = await loop.run_in_executor(None, lambda: s.wpg.state("prefetch", dep=name))
                self._prefetched += sum(moved)
        except (StateError, WorkerError, OSError) as exc:
            log.debug("state hint %s for %s: %s", cmd.kind, cmd.dep, exc)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _turn(self, group: int, op_id: int) -> None:
        async with self._locks[group]:
            await self._carry_out(self.core.handle(ev.Turn(group, op_id), self.now()))

    async def _park(self, s: Served, *, recover: bool) -> str | None:
        """Offload `s` to wait for its turn (the caller holds its group); why it could not."""
        await self._carry_out(self.core.handle(ev.Park(s.id, recover), self.now()))
        return self._parked.pop(s.id, None)

    # ---- deployments ------------------------------------------------------------------------
    async def create(
        self,
        *,
        job_id: str,
        model: str,
        role: str,
        dp: int,
        group: int | None,
        seed: int = 0,
        trace: Footprint | None = None,
        estimates: dict[str, float] | None = None,
        model_options: dict[str, Any] | None = None,
    ) -> Served:
        """Start a deployment of `model` (`models.parse_model`: "tiny", a local Hugging Face
        directory or a worker class `module:Class`, built with `model_options` as keywords).
        `estimates`: profiled seconds per operation kind, HRRS's E until the service has
        measured them. Its node group: `group` if named, else where the core places it."""
        if self.core.closing:
            raise Conflict("the service is shutting down")
        ref = parse_model(model)  # (ConfigError: what it cannot be)
        options = dict(model_options or {})
        dep_id = f"{job_id}:{role}"
        if dep_id in self.served:
            raise Conflict(f"deployment {dep_id} exists already")
        clash = [d for d in self.served if _wpg_name(d) == _wpg_name(dep_id)]
        if clash:  # its state would be keyed like the other's on a node's sidecar
            raise Conflict(f"deployment {dep_id} would share its state's name with {clash[0]}")
        known = self.core.settings.known_ops
        bad = sorted(k for k, v in (estimates or {}).items() if k not in known or not v >= 0)
        if bad:
            raise ConfigError(f"estimates for unknown operations or below 0 s: {bad}")
        self.launcher.check_layout(dp)
        group, placed = self.core.place(dep_id, group, trace, self.now())
        s = Served(
            Deployment(dep_id, job_id, group, placement=placed),
            wpg=None,  # type: ignore[arg-type]  # (until it has started)
            model=ref.target,
            dp=dp,
            seed=seed,
            model_options=options,
        )
        try:
            s.wpg = await self._launch(s, group)
        except ConfigError:  # its workers could not build the model as named
            self.core.release(dep_id)
            raise
        except (WorkerError, StateError) as exc:
            self.core.release(dep_id)
            raise Unavailable(f"could not start {dep_id}'s worker processes: {exc}") from None
        self.served[dep_id] = s
        # a new deployment starts resident; if its group holds another or is busy, it waits
        # offloaded for its turn (one job's state on the group's devices at a time)
        if self.core.add(s.dep, estimates):
            async with self._locks[group]:
                error = await self._park(s, recover=False)
            if error is not None:
                del self.served[dep_id]
                self.core.remove(dep_id)
                await asyncio.get_running_loop().run_in_executor(None, s.wpg.close)
                raise Unavailable(f"{dep_id} could not wait offloaded for its turn: {error}")
        log.info("deployment %s (dp %d) on node group %d", dep_id, dp, group)
        if self._watchdog is None and self.watch_s > 0:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())
        return s

    def _node_lost(self, group: int, names: list[str]) -> None:
        """A group's state holder died and was started again: the plan it had is gone."""
        self.core.plan_reset(group)

    async def _launch(self, s: Served, group: int, *, start_offloaded: bool = False) -> Workers:
        """Start a deployment's worker group on `group`."""
        name = _wpg_name(s.id)
        cfg = WorkerGroupConfig(
            name=name,
            dp=s.dp,
            seed=s.seed,
            model=s.model,
            model_options=s.model_options,
            state_dir=None if self.state_dir is None else self.state_dir / name,
            start_offloaded=start_offloaded,
            settle_s=self.settle_s,
            faults=self.faults,
        )
        return await self.launcher.launch(cfg, group)

    def _ready(self, dep_id: str) -> Served:
        self.core.ready(dep_id)  # (NotFound, Conflict: why it is not)
        return self.served[dep_id]

    async def repack(self, dep_id: str, trace: Footprint) -> Served:
        """A deployment's cycle is profiled (§4.3.2: cold start, then repacking): place it
        from its trace. If its node group changes, its state leaves the old group's devices
        and its later operations queue on the new group."""
        s = self._ready(dep_id)
        placed = self.core.repack(dep_id, trace, self.now())
        if placed is None:
            return s  # nothing fits: it stays where it is
        if placed.group != s.dep.group:
            await self.migrate(dep_id, placed.group)
        return s

    async def migrate(self, dep_id: str, group: int) -> Served:
        """Move a deployment to node group `group` (§4.5.3): offload it, mirror its state to
        that node's sidecar, start its ranks there with their state waiting, and stop the old
        ones (whose sidecar then forgets it). On Ray a group is a label over Ray's nodes: the
        deployment's actors and their node sidecars stay, its operations queue on `group`."""
        s = self._ready(dep_id)
        if not 0 <= group < len(self.groups):
            raise ConfigError(f"no node group {group} (this service has {len(self.groups)})")
        if group == s.dep.group:
            return s
        if self.core.busy(dep_id):
            raise Conflict(f"{dep_id} has operations queued or running: move it between steps")
        s.dep.migrating = True  # NOTE: no operation is accepted for it until it has landed
        try:
            async with self._migrating:  # one at a time: two nodes never wait on each other
                await self._migrate(s, group)
        finally:
            s.dep.migrating = False
        log.info("deployment %s moved to node group %d", dep_id, group)
        return s

    async def _migrate(self, s: Served, group: int) -> None:
        async with self._locks[s.dep.group]:
            error = await self._park(s, recover=True)
        if error is not None:
            raise Unavailable(f"could not offload {s.id} to move it: {error}")
        if self.launcher.moves_state:
            loop = asyncio.get_running_loop()
            name = s.wpg.config.name
            async with s.lock:
                try:
                    await self.launcher.mirror(name, s.dep.group, group)
                    wpg = await self._launch(s, group, start_offloaded=True)
                except (WorkerError, StateError, OSError) as exc:
                    await self.launcher.unmirror(name, group)  # nothing half-moved stays there
                    raise Unavailable(f"could not move {s.id} to group {group}: {exc}") from None
                old_wpg, s.wpg = s.wpg, wpg
                await loop.run_in_executor(None, old_wpg.close)  # the old node forgets it
        self.core.moved(s.id, group)

    async def delete_job(self, job_id: str) -> list[str]:
        """Stop a job's deployments: queued operations cancelled, a running one's ranks
        killed (it is cancelled too: a deleted job never holds its group), state dropped."""
        await self._carry_out(self._handle(ev.DeleteJob(job_id)))
        gone = [s for s in self.served.values() if s.dep.job == job_id]
        for s in gone:
            while self.core.in_use(s.id):
                # its running operation ends (its ranks are gone), and what else the core
                # gave that touches it: a switch's offload of it, its recovery, a checkpoint
                await asyncio.sleep(0.01)
            async with s.lock:
                await self._carry_out(self.core.handle(ev.Forget(s.id), self.now()))
            self.served.pop(s.id, None)
        return [s.id for s in gone]

    # ---- operations -------------------------------------------------------------------------
    def submit(
        self,
        dep_id: str,
        kind: str,
        payload: dict[str, Any],
        *,
        deadline_s: float | None = None,
    ) -> OpRecord:
        """Queue an operation. Its payload is checked against the deployment's model first
        (ConfigError saying what is wrong); `deadline_s` overrides how long it may run."""
        if self.core.closing:
            raise Conflict("the service is shutting down")
        s = self._ready(dep_id)
        if kind in self.core.settings.known_ops:
            s.wpg.check(kind, payload)
        cmds = self._handle(ev.Submit(dep_id, kind, payload, deadline_s))
        accepted = next(c for c in cmds if isinstance(c, ev.Accepted))
        return self.core.ops[accepted.op_id]

    # ---- the watchdog -----------------------------------------------------------------------
    async def _watch(self) -> None:
        """Find groups whose ranks died while no operation of theirs ran, and recover them
        (under their group's lock, so never in the middle of another's switch); and node
        groups whose sidecar died, whose deployments then have no state manager."""
        while not self.core.closing:
            await asyncio.sleep(self.watch_s)
            try:
                self._look()
            except Exception:  # (the watch goes on whatever one look met)
                log.exception("the cluster watchdog")

    def _look(self) -> None:
        for g, why in self.launcher.lost_nodes().items():
            if g not in self._nodes_lost:
                self._nodes_lost.add(g)
                self._spawn(self._recover_node(g, why))
        for s in list(self.served.values()):
            dep = s.dep
            if dep.status is not DeploymentStatus.READY or dep.migrating or dep.deleting:
                continue
            if s.watched or s.wpg.death() is None:
                continue
            s.watched = True
            self._spawn(self._recover_dead(s))

    async def _recover_node(self, group: int, why: str) -> None:
        """The node's sidecar died: the state it held is gone and its deployments' ranks can
        move no state. They are torn down and failed; the next deployment there starts a
        new sidecar."""
        try:
            async with self._locks[group]:
                log.error("%s: the state it held is lost", why)
                await self._carry_out(self.core.handle(ev.NodeLost(group, why), self.now()))
        finally:
            self._nodes_lost.discard(group)

    async def _recover_dead(self, s: Served) -> None:
        try:
            async with self._locks[s.dep.group]:
                dead = s.wpg.death()
                if dead is not None:
                    await self._carry_out(self.core.handle(ev.RankDied(s.id, dead), self.now()))
        finally:
            s.watched = False

    async def wait(self, op_id: int, wait_s: float) -> OpRecord:
        rec = self.core.ops.get(op_id)
        if rec is None:
            if 0 <= op_id <= self.core.last_id():
                raise NotFound(
                    f"operation {op_id} finished and was forgotten (the service keeps the "
                    f"last {self.retain_ops}: retain_ops)"
                )
            raise NotFound(f"no operation {op_id}")
        if not rec.status.terminal and wait_s > 0:
            waiter = self._waiters.setdefault(op_id, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.wait(), wait_s)
        return rec

    # ---- views and lifecycle ---------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        by_status: dict[str, int] = {}
        for r in self.core.ops.values():
            by_status[r.status.value] = by_status.get(r.status.value, 0) + 1
        return {
            "policy": self.core.settings.policy.value,
            "groups": [
                {
                    "group": g,
                    "resident": s.resident,
                    "running": None if s.running is None else s.running.op_id,
                    "queued": len(s.queue),
                    "deployments": sorted(d.id for d in self.served.values() if d.dep.group == g),
                }
                for g, s in enumerate(self.groups)
            ],
            "deployments": {d.id: d.view() for d in self.served.values()},
            "ops": by_status,
            "counts": self.counts,
        }

    async def close(self, grace_s: float = 10.0) -> None:
        """Stop: queued operations are cancelled, running ones get `grace_s` to finish (then
        their ranks are killed and they are cancelled), WPGs and sidecars stop."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        await self._carry_out(self._handle(ev.Shutdown()))
        loop = asyncio.get_running_loop()
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=grace_s)
            if late:
                for s in list(self.served.values()):
                    if self.core.running_on(s.id):
                        await loop.run_in_executor(None, s.wpg.kill)
                await asyncio.gather(*self._tasks, return_exceptions=True)
        for s in list(self.served.values()):
            await loop.run_in_executor(None, s.wpg.close)
        self.served.clear()
        await self.launcher.close()

    async def state_stats(self) -> dict[str, Any]:
        """What holds the deployments' state: each node group's sidecar (bytes by tier,
        moves, its plan, its deployments), or each deployment's on Ray."""
        return await self.launcher.stats({s.id: s.wpg for s in self.served.values()})
