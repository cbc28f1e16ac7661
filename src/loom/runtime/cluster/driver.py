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

One asyncio loop owns the policy objects; a WPG call blocks, so it runs in a thread. Every
accepted operation reaches a terminal state: succeeded, failed (its error says why), or
cancelled when its job is deleted or the service stops.

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
import collections
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from loom.cluster.faults import DeadlinePolicy, Recovery, RecoveryAction, RecoveryPolicy
from loom.cluster.plexrl.group import Dispatch, GroupScheduler
from loom.cluster.plexrl.hrrs import OP_POLICIES, Op, OpPolicyKind
from loom.cluster.plexrl.placement import JobPlacement, PlacementConfig, PlexPlacement
from loom.cluster.plexrl.timeline import HORIZON_SLOTS, Footprint, Timeline
from loom.core.errors import ConfigError, Conflict, NotFound, Unavailable
from loom.runtime.cluster.launchers import Launcher, make_launcher
from loom.runtime.cluster.models.ref import parse_model
from loom.runtime.cluster.payloads import FAULT_OP
from loom.runtime.cluster.wpg import (
    OPS,
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
    "OpStatus",
    "Unavailable",
]

log = logging.getLogger("loom.cluster")

USER_OPS = tuple(o for o in OPS if o not in ("offload", "load", FAULT_OP))
EWMA = 0.5  # weight of the newest measurement in a duration estimate


class OpStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (OpStatus.SUCCEEDED, OpStatus.FAILED, OpStatus.CANCELLED)


class DeploymentStatus(StrEnum):
    READY = "ready"  # its ranks run (its state resident or offloaded)
    RECOVERING = "recovering"  # its ranks were torn down; being started again or failed
    FAILED = "failed"  # torn down for good: its error says why (delete the job to go on)


@dataclass
class OpRecord:
    op_id: int
    deployment: str
    job: str
    kind: str
    payload: dict[str, Any]
    submitted_s: float
    status: OpStatus = OpStatus.QUEUED
    started_s: float | None = None
    ended_s: float | None = None
    setup_s: float = 0.0  # the switch paid before it
    override_s: float | None = None  # the deadline its caller named
    deadline_s: float | None = None  # how long it may run, set when it starts
    result: dict[str, Any] | None = None
    error: str | None = None
    system: bool = False  # an offload or load the scheduler inserted
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def view(self) -> dict[str, Any]:
        return {
            "op_id": self.op_id,
            "deployment": self.deployment,
            "job": self.job,
            "op": self.kind,
            "status": self.status.value,
            "submitted_s": self.submitted_s,
            "started_s": self.started_s,
            "ended_s": self.ended_s,
            "setup_s": self.setup_s,
            "deadline_s": self.deadline_s,
            "result": self.result,
            "error": self.error,
            "system": self.system,
        }


@dataclass
class Deployment:
    id: str
    job: str
    model: str
    role: str
    group: int
    wpg: Workers  # its worker group, however its ranks run
    seq: int = 0  # operations submitted (their order within the deployment)
    placement: JobPlacement | None = None  # how PlexRL's placement put it there, if it did
    dp: int = 1
    seed: int = 0
    model_options: dict[str, Any] = field(default_factory=dict)
    # NOTE: its state moves (offload, load, an offloaded checkpoint, a migration) one at a time
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    migrating: bool = False
    deleting: bool = False
    status: DeploymentStatus = DeploymentStatus.READY
    error: str | None = None  # why it failed
    restarts: int = 0  # its worker group started again from its offloaded state
    watched: bool = False  # the watchdog has a recovery of it under way

    def view(self) -> dict[str, Any]:
        placed = self.placement
        return {
            "id": self.id,
            "job": self.job,
            "model": self.model,
            "role": self.role,
            "status": self.status.value,
            "error": self.error,
            "restarts": self.restarts,
            "group": self.group,
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
        if groups < 1:
            raise ConfigError(f"groups must be >= 1, got {groups}")
        if gpus_per_group < 1:
            raise ConfigError(f"gpus_per_group must be >= 1, got {gpus_per_group}")
        self.gpus_per_group = gpus_per_group
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
        self._plans: list[list[str]] = [[] for _ in range(groups)]  # the last sent to each node
        self._migrating = asyncio.Lock()
        self.policy = OpPolicyKind(policy)
        self.state_dir = state_dir
        self.clock = clock
        self._t0 = clock()
        self.deployments: dict[str, Deployment] = {}
        self.ops: dict[int, OpRecord] = {}
        if retain_ops < 1:
            raise ConfigError(f"retain_ops must be >= 1, got {retain_ops}")
        self._finished: collections.deque[int] = collections.deque()
        self.retain_ops = retain_ops
        self.forgotten = 0  # finished operations dropped beyond retain_ops
        self._last_id = -1
        self._exec: dict[tuple[str, str], float] = {}  # (deployment, op) -> seconds
        self._measured: dict[tuple[str, str], float] = {}  # the same, from runs only
        self._switch: dict[str, float] = {}  # deployment -> offload + load seconds
        self.default_exec_s = default_exec_s
        self.default_switch_s = default_switch_s
        self.groups = [
            GroupScheduler(OP_POLICIES.get(self.policy)(), self._setup_estimate)
            for _ in range(groups)
        ]
        # PlexRL's placement over the node groups (one timeline node each): cold starts take a
        # group of their own, profiled traces are fitted with a phase shift
        self.placement = PlexPlacement(
            Timeline(nodes=groups, horizon=HORIZON_SLOTS),
            PlacementConfig(groups=tuple((g,) for g in range(groups)), duty_bound=1.0),
        )
        # NOTE: a group's devices hold one job's work at a time: every operation and every
        # state move on a group runs under its lock (a new deployment's first offload too)
        self._locks = [asyncio.Lock() for _ in range(groups)]
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self.deadlines = deadlines or DeadlinePolicy()
        self.recovery = recovery or RecoveryPolicy()
        self.settle_s, self.watch_s, self.faults = settle_s, watch_s, faults
        self._watchdog: asyncio.Task[None] | None = None
        self._nodes_lost: set[int] = set()  # groups whose dead sidecar is being dealt with
        self.counts = {
            "ops": 0,
            "switches": 0,
            "failed": 0,
            "prefetched_bytes": 0,
            "offloaded_checkpoints": 0,
            "migrations": 0,
            "restarts": 0,
            "failed_deployments": 0,
        }

    def now(self) -> float:
        return self.clock() - self._t0

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
    ) -> Deployment:
        """Start a deployment of `model` (`models.parse_model`: "tiny", a local Hugging Face
        directory or a worker class `module:Class`, built with `model_options` as keywords).
        `estimates`: profiled seconds per operation kind, HRRS's E
        until the service has measured them. Its node group: `group` if named; else, with a
        profiled `trace`, where PlexRL's placement fits it (§4.3.2, warm start); else a group of its
        own (cold start) while one is free, and the least-shared group when none is."""
        if self._closing:
            raise Conflict("the service is shutting down")
        ref = parse_model(model)  # (ConfigError: what it cannot be)
        options = dict(model_options or {})
        dep_id = f"{job_id}:{role}"
        if dep_id in self.deployments:
            raise Conflict(f"deployment {dep_id} exists already")
        clash = [d.id for d in self.deployments.values() if d.wpg.config.name == _wpg_name(dep_id)]
        if clash:  # its state would be keyed like the other's on a node's sidecar
            raise Conflict(f"deployment {dep_id} would share its state's name with {clash[0]}")
        if group is not None and not 0 <= group < len(self.groups):
            raise ConfigError(f"no node group {group} (this service has {len(self.groups)})")
        known = USER_OPS + ((FAULT_OP,) if self.faults else ())
        bad = sorted(k for k, v in (estimates or {}).items() if k not in known or not v >= 0)
        if bad:
            raise ConfigError(f"estimates for unknown operations or below 0 s: {bad}")
        self.launcher.check_layout(dp)
        group, placed = self._place(dep_id, group, trace)
        try:
            wpg = await self._launch(dep_id, group, dp, seed, model=ref.target, options=options)
        except ConfigError:  # its workers could not build the model as named
            if placed is not None:
                self.placement.release(dep_id)
            raise
        except (WorkerError, StateError) as exc:
            if placed is not None:
                self.placement.release(dep_id)
            raise Unavailable(f"could not start {dep_id}'s worker processes: {exc}") from None
        dep = Deployment(
            dep_id,
            job_id,
            ref.target,
            role,
            group,
            wpg,
            placement=placed,
            dp=dp,
            seed=seed,
            model_options=options,
        )
        self.deployments[dep_id] = dep
        for kind, secs in (estimates or {}).items():
            self._exec[(dep_id, kind)] = float(secs)
        # a new deployment starts resident; if its group holds another or is busy, it waits
        # offloaded for its turn (one job's state on the group's devices at a time)
        sched = self.groups[group]
        if sched.resident is None and sched.running is None:
            sched.resident = dep_id
        else:
            try:
                async with self._locks[group]:
                    await self._move(dep, "offload", group)
            except WorkerError as exc:
                del self.deployments[dep_id]
                if placed is not None:
                    self.placement.release(dep_id)
                await asyncio.get_running_loop().run_in_executor(None, wpg.close)
                raise Unavailable(
                    f"{dep_id} could not wait offloaded for its turn: {exc}"
                ) from None
        log.info("deployment %s (dp %d) on node group %d", dep_id, dp, group)
        if self._watchdog is None and self.watch_s > 0:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())
        return dep

    def _node_lost(self, group: int, names: list[str]) -> None:
        """A group's state holder died and was started again: the plan it had is gone."""
        self._plans[group] = []

    async def _launch(
        self,
        dep_id: str,
        group: int,
        dp: int,
        seed: int,
        *,
        model: str,
        options: dict[str, Any],
        start_offloaded: bool = False,
    ) -> Workers:
        """Start a deployment's worker group on `group`."""
        name = _wpg_name(dep_id)
        cfg = WorkerGroupConfig(
            name=name,
            dp=dp,
            seed=seed,
            model=model,
            model_options=options,
            state_dir=None if self.state_dir is None else self.state_dir / name,
            start_offloaded=start_offloaded,
            settle_s=self.settle_s,
            faults=self.faults,
        )
        return await self.launcher.launch(cfg, group)

    def _place(
        self, dep_id: str, group: int | None, trace: Footprint | None
    ) -> tuple[int, JobPlacement | None]:
        self.placement.timeline.advance(int(self.now()))
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

    async def repack(self, dep_id: str, trace: Footprint) -> Deployment:
        """A deployment's cycle is profiled (§4.3.2: cold start, then repacking): place it
        from its trace. If its node group changes, its state leaves the old group's devices
        and its later operations queue on the new group."""
        dep = self._ready(dep_id)
        old = self.groups[dep.group]
        if any(o.job == dep_id for o in old.queue) or (
            old.running is not None and old.running.job == dep_id
        ):
            raise Conflict(f"{dep_id} has operations queued or running: repack it between steps")
        self.placement.timeline.advance(int(self.now()))
        if self.placement.group_of(dep_id) is not None:
            placed = self.placement.repack(dep_id, trace)
        else:
            placed = self.placement.place(dep_id, trace)
        if placed is None:
            return dep  # nothing fits: it stays where it is
        dep.placement = placed
        if placed.group != dep.group:
            await self.migrate(dep_id, placed.group)
        return dep

    async def migrate(self, dep_id: str, group: int) -> Deployment:
        """Move a deployment to node group `group` (§4.5.3): offload it, mirror its state to
        that node's sidecar, start its ranks there with their state waiting, and stop the old
        ones (whose sidecar then forgets it). On Ray a group is a label over Ray's nodes: the
        deployment's actors and their node sidecars stay, its operations queue on `group`."""
        dep = self._ready(dep_id)
        if not 0 <= group < len(self.groups):
            raise ConfigError(f"no node group {group} (this service has {len(self.groups)})")
        if group == dep.group:
            return dep
        old = self.groups[dep.group]
        if (
            dep.migrating
            or any(o.job == dep_id for o in old.queue)
            or (old.running is not None and old.running.job == dep_id)
        ):
            raise Conflict(f"{dep_id} has operations queued or running: move it between steps")
        dep.migrating = True  # NOTE: no operation is accepted for it until it has landed
        try:
            async with self._migrating:  # one at a time: two nodes never wait on each other
                await self._migrate(dep, group)
        finally:
            dep.migrating = False
        self.counts["migrations"] += 1
        log.info("deployment %s moved to node group %d", dep_id, group)
        return dep

    async def _migrate(self, dep: Deployment, group: int) -> None:
        old = self.groups[dep.group]
        async with self._locks[dep.group]:
            try:
                if old.resident == dep.id:
                    await self._move(dep, "offload", dep.group)
            except GroupBroken as exc:
                await self._recover(dep, f"its offload (to move it) failed: {exc}")
                raise Unavailable(f"could not offload {dep.id} to move it: {exc}") from None
            except WorkerError as exc:
                raise Unavailable(f"could not offload {dep.id} to move it: {exc}") from None
        if self.launcher.moves_state:
            loop = asyncio.get_running_loop()
            name = dep.wpg.config.name
            async with dep.lock:
                try:
                    await self.launcher.mirror(name, dep.group, group)
                    wpg = await self._launch(
                        dep.id,
                        group,
                        dep.dp,
                        dep.seed,
                        model=dep.model,
                        options=dep.model_options,
                        start_offloaded=True,
                    )
                except (WorkerError, StateError, OSError) as exc:
                    await self.launcher.unmirror(name, group)  # nothing half-moved stays there
                    raise Unavailable(f"could not move {dep.id} to group {group}: {exc}") from None
                old_wpg, dep.wpg = dep.wpg, wpg
                await loop.run_in_executor(None, old_wpg.close)  # the old node forgets it
        dep.group = group

    async def _move(self, dep: Deployment, kind: str, group: int) -> None:
        """Offload or load `dep`'s state (an operation of its own in the records). Raises
        `GroupBroken` if its group must be torn down, `WorkerError` if the move was refused
        (the group holds what it held)."""
        payload = {"tier": "host"} if kind == "offload" else {}
        rec = OpRecord(self._new_id(), dep.id, dep.job, kind, payload, self.now(), system=True)
        self.ops[rec.op_id] = rec
        async with dep.lock:
            err = await self._execute(dep, rec)
            if err is not None:
                broken = await self._broken(dep, err)
                if broken is not None:
                    raise GroupBroken(f"{kind} of {dep.id}: {broken}")
                raise WorkerError(f"{kind} of {dep.id} failed: {rec.error}")
        if kind == "offload" and self.groups[group].resident == dep.id:
            self.groups[group].resident = None

    async def delete_job(self, job_id: str) -> list[str]:
        """Stop a job's deployments: queued operations cancelled, a running one's ranks
        killed (it is cancelled too: a deleted job never holds its group), state dropped."""
        gone = [d for d in self.deployments.values() if d.job == job_id]
        if not gone:
            raise NotFound(f"no deployment of job {job_id!r}")
        if any(d.migrating for d in gone):
            raise Conflict(f"a deployment of {job_id} is moving: delete it when it has landed")
        loop = asyncio.get_running_loop()
        for dep in gone:
            dep.deleting = True
            sched = self.groups[dep.group]
            for op in sched.withdraw(dep.id):
                self._end(self.ops[op.op_id], OpStatus.CANCELLED, error=f"job {job_id} was deleted")
            if sched.running is not None and sched.running.job == dep.id:
                await loop.run_in_executor(None, dep.wpg.kill)
            while sched.running is not None and sched.running.job == dep.id:
                await asyncio.sleep(0.01)  # its running operation ends (its ranks are gone)
            async with dep.lock:  # (a recovery or a checkpoint of it ends first)
                if sched.resident == dep.id:
                    sched.resident = None
                if self.placement.group_of(dep.id) is not None:
                    self.placement.release(dep.id)
                await loop.run_in_executor(None, dep.wpg.close)
            self.deployments.pop(dep.id, None)
        return [d.id for d in gone]

    def _ready(self, dep_id: str) -> Deployment:
        dep = self.deployments.get(dep_id)
        if dep is None or dep.deleting:
            raise NotFound(f"no deployment {dep_id!r}")
        if dep.status is DeploymentStatus.FAILED:
            raise Conflict(
                f"deployment {dep_id} failed: {dep.error}. Delete job {dep.job} to free its "
                "name, then create it again"
            )
        return dep

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
        if self._closing:
            raise Conflict("the service is shutting down")
        dep = self._ready(dep_id)
        known = USER_OPS + ((FAULT_OP,) if self.faults else ())
        if kind not in known:
            raise ConfigError(f"unknown operation {kind!r}; known: {', '.join(USER_OPS)}")
        if deadline_s is not None and not deadline_s > 0:
            raise ConfigError(f"deadline_s must be > 0, got {deadline_s}")
        if dep.migrating:
            raise Conflict(f"{dep_id} is moving to another node group: call again when it has")
        dep.wpg.check(kind, payload)
        rec = OpRecord(self._new_id(), dep_id, dep.job, kind, payload, self.now())
        rec.override_s = deadline_s
        self.ops[rec.op_id] = rec
        if kind == "save_ckpt" and self._offloaded_and_idle(dep):
            self._spawn(self._checkpoint_offloaded(dep, rec))
            self.counts["ops"] += 1
            return rec
        exec_s = self._exec.get((dep_id, kind), self.default_exec_s)
        self.groups[dep.group].submit(Op(rec.op_id, dep_id, rec.submitted_s, exec_s, dep.seq))
        dep.seq += 1
        self.counts["ops"] += 1
        self._pump(dep.group)
        return rec

    def _deadline(self, dep: Deployment, kind: str, override_s: float | None) -> float:
        """How long an operation of `kind` may run: from its measured duration once it has
        run, else the deployment's estimate, else the service's default."""
        key = (dep.id, kind)
        default = self.default_switch_s if kind in ("offload", "load") else self.default_exec_s
        expected = self._measured.get(key, self._exec.get(key, default))
        return self.deadlines.deadline_s(expected, override_s)

    def _offloaded_and_idle(self, dep: Deployment) -> bool:
        sched = self.groups[dep.group]
        return (
            dep.status is DeploymentStatus.READY
            and sched.resident != dep.id
            and not (sched.running is not None and sched.running.job == dep.id)
            and not any(o.job == dep.id for o in sched.queue)
            and not dep.lock.locked()
        )

    async def _checkpoint_offloaded(self, dep: Deployment, rec: OpRecord) -> None:
        """A checkpoint from the state the sidecar holds: no switch, the group runs on."""
        rec.status, rec.started_s = OpStatus.RUNNING, self.now()
        rec.deadline_s = self._deadline(dep, rec.kind, rec.override_s)
        loop = asyncio.get_running_loop()
        name = dep.wpg.config.name
        try:
            async with dep.lock:
                out = await asyncio.wait_for(
                    loop.run_in_executor(
                        None,
                        lambda: dep.wpg.state("checkpoint", dep=name, path=rec.payload["path"]),
                    ),
                    rec.deadline_s,
                )
        except TimeoutError:
            self.counts["failed"] += 1
            error = f"save_ckpt ran past its deadline of {rec.deadline_s:g} s"
            self._end(rec, OpStatus.FAILED, error=error)
            return
        except (StateError, WorkerError) as exc:
            self.counts["failed"] += 1
            self._end(rec, OpStatus.FAILED, error=str(exc))
            return
        meta = out[0].pop("meta", {})
        rec.result = out[0] | {"step": meta.get("step"), "from": "offloaded state"}
        self.counts["offloaded_checkpoints"] += 1
        self._end(rec, OpStatus.SUCCEEDED)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _pump(self, group: int) -> None:
        if self._closing:
            return
        d = self.groups[group].next(self.now())  # (none while one runs)
        if d is None:
            return
        self._spawn(self._run(group, d))

    def _live(self, dep_id: str | None) -> Deployment | None:
        dep = self.deployments.get(dep_id) if dep_id is not None else None
        ok = dep is not None and dep.status is DeploymentStatus.READY and not dep.deleting
        return dep if ok else None

    async def _hint(self, dep: Deployment, kind: str, upcoming: Sequence[str] = ()) -> None:
        """A hint to the StateManager of `dep`'s node (§4.5.1): the group's `plan` (the
        deployments in the order they will run: eviction reads it), or `prefetch` of `dep`'s
        state to host ahead of its switch. A hint that fails costs nothing but its benefit."""
        loop = asyncio.get_running_loop()
        try:
            if kind == "plan":
                names = [self.deployments[d].wpg.config.name for d in upcoming]
                await loop.run_in_executor(None, lambda: dep.wpg.state("plan", upcoming=names))
            elif not dep.lock.locked():
                name = dep.wpg.config.name
                moved = await loop.run_in_executor(
                    None, lambda: dep.wpg.state("prefetch", dep=name)
                )
                self.counts["prefetched_bytes"] += sum(moved)
        except (StateError, WorkerError, OSError) as exc:
            log.debug("state hint %s for %s: %s", kind, dep.id, exc)

    async def _run(self, group: int, d: Dispatch) -> None:
        rec = self.ops[d.op.op_id]
        sched = self.groups[group]
        try:
            async with self._locks[group]:
                dep = self.deployments.get(rec.deployment)
                if dep is None or dep.deleting or dep.status is DeploymentStatus.FAILED:
                    # (it failed or went while this waited: its switch never happens)
                    if d.load is not None:
                        sched.resident = d.offload if self._live(d.offload) else None
                    if dep is not None and dep.status is DeploymentStatus.FAILED:
                        self._end(rec, OpStatus.FAILED, error=f"{dep.id} failed: {dep.error}")
                    else:
                        self._end(rec, OpStatus.CANCELLED, error="its deployment is gone")
                    return
                await self._switch_and_execute(group, d, dep, rec)
        finally:
            sched.done(d.op.op_id)
            self._pump(group)

    async def _switch_and_execute(
        self, group: int, d: Dispatch, dep: Deployment, rec: OpRecord
    ) -> None:
        sched = self.groups[group]
        upcoming = [j for j in sched.upcoming if self._live(j) is not None]
        if upcoming != self._plans[group]:  # the switch's eviction follows it
            self._plans[group] = upcoming
            await self._hint(dep, "plan", upcoming=upcoming)
        if d.offload is not None or d.load is not None:
            t0 = self.clock()
            if not await self._switch_to(group, d.offload, dep, rec):
                return
            self._learn_switch(dep.id, self.clock() - t0)
            rec.setup_s = self.clock() - t0
            self.counts["switches"] += 1
        other = self._live(next((j for j in upcoming if j != dep.id), None))
        if other is not None:  # the next switch's state comes up while this operation runs
            self._spawn(self._hint(other, "prefetch"))
        err = await self._execute(dep, rec)
        if err is not None and not dep.deleting:
            broken = await self._broken(dep, err)
            if broken is not None:
                await self._recover(dep, broken)

    async def _switch_to(
        self, group: int, old_id: str | None, dep: Deployment, rec: OpRecord
    ) -> bool:
        """Offload the resident deployment and load `dep` (§5.2.2). A resident deployment
        that is failed, gone or breaks on its offload does not hold up the switch: it is torn
        down and its state dropped (or kept, by the recovery policy). False (and `rec`
        ended) if `dep` cannot be loaded."""
        sched = self.groups[group]
        old = self._live(old_id)
        if old is not None and old is not dep:
            try:
                await self._move(old, "offload", group)
            except GroupBroken as exc:
                await self._recover(old, f"its offload for the switch to {dep.id} failed: {exc}")
            except WorkerError as exc:  # refused (no room on the node): it stays resident
                sched.resident = old.id
                self.counts["failed"] += 1
                self._end(rec, OpStatus.FAILED, error=f"the switch to {dep.id} failed: {exc}")
                return False
        sched.resident = None
        why = ""
        for _ in range(2):  # a second try after its group was started again from its state
            try:
                await self._move(dep, "load", group)
            except GroupBroken as exc:
                why = str(exc)
                if not dep.deleting and await self._recover(dep, f"its load failed: {exc}"):
                    continue
                break
            except WorkerError as exc:
                why = f"the switch to {dep.id} failed: {exc}"
                break
            sched.resident = dep.id
            return True
        if dep.deleting:
            self._end(rec, OpStatus.CANCELLED, error=f"job {dep.job} was deleted")
        else:
            self.counts["failed"] += 1
            error = f"{dep.id} failed: {dep.error}" if dep.error else why
            self._end(rec, OpStatus.FAILED, error=error)
        return False

    async def _execute(self, dep: Deployment, rec: OpRecord) -> Exception | None:
        """Run `rec` on `dep`'s group within its deadline; the error, if it failed."""
        rec.status = OpStatus.RUNNING
        rec.started_s = self.now()
        rec.deadline_s = self._deadline(dep, rec.kind, rec.override_s)
        t0 = self.clock()
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(
                None, dep.wpg.run, rec.kind, rec.payload, rec.deadline_s
            )
        except Exception as exc:  # every accepted operation ends, with what went wrong
            if isinstance(exc, (WorkerError, ConfigError)):
                error = str(exc)
            else:
                log.exception("%s %s", dep.id, rec.kind)
                error = f"{type(exc).__name__}: {exc}"
            if dep.deleting or self._closing:
                why = "the service stopped" if self._closing else f"job {dep.job} was deleted"
                self._end(rec, OpStatus.CANCELLED, error=f"{why} while it ran")
            else:
                self.counts["failed"] += 1
                self._end(rec, OpStatus.FAILED, error=error)
            return exc
        took = self.clock() - t0
        key = (dep.id, rec.kind)
        for seen in (self._exec, self._measured):
            old = seen.get(key)
            seen[key] = took if old is None else EWMA * took + (1 - EWMA) * old
        rec.result = result
        self._end(rec, OpStatus.SUCCEEDED)
        return None

    async def _broken(self, dep: Deployment, err: Exception) -> str | None:
        """Why `dep`'s group must be torn down after `err`, or None if it can go on: a rank
        raised and the others answered soon after (they were not left in a collective)."""
        if isinstance(err, GroupBroken):
            return str(err)
        if isinstance(err, RankFailed) and err.pending:
            loop = asyncio.get_running_loop()
            if not await loop.run_in_executor(None, dep.wpg.settle, self.settle_s):
                return (
                    f"{err}; ranks {sorted(err.pending)} were still in it {self.settle_s:g} s later"
                )
        return None

    # ---- recovery ---------------------------------------------------------------------------
    async def _recover(self, dep: Deployment, reason: str) -> bool:
        """Tear `dep`'s worker group down (its ranks killed) and, as the recovery policy
        decides, start it again with its state waiting on the node's sidecar, or fail it.
        The caller holds its group's lock. True if it was started again."""
        if dep.deleting or self._closing or dep.status is not DeploymentStatus.READY:
            return False
        dep.status = DeploymentStatus.RECOVERING
        loop = asyncio.get_running_loop()
        log.warning("tearing down %s's worker group: %s", dep.id, reason)
        async with dep.lock:
            await loop.run_in_executor(None, dep.wpg.kill)
            sched = self.groups[dep.group]
            if sched.resident == dep.id:
                sched.resident = None
            intact = await loop.run_in_executor(None, dep.wpg.state_intact)
            decision = self.recovery.decide(
                reason=reason, state_intact=intact, restarts=dep.restarts
            )
            if decision.action is RecoveryAction.RESTART:
                try:
                    wpg = await self._launch(
                        dep.id,
                        dep.group,
                        dep.dp,
                        dep.seed,
                        model=dep.model,
                        options=dep.model_options,
                        start_offloaded=True,
                    )
                except (WorkerError, StateError) as exc:
                    decision = Recovery(RecoveryAction.FAIL, f"{reason}; its restart failed: {exc}")
                else:
                    old, dep.wpg = dep.wpg, wpg
                    await loop.run_in_executor(None, functools.partial(old.close, keep_state=True))
                    dep.restarts += 1
                    dep.status = DeploymentStatus.READY
                    self.counts["restarts"] += 1
                    log.warning("%s started again from its offloaded state", dep.id)
                    return True
            await loop.run_in_executor(None, dep.wpg.close)  # its state on the sidecar too
            self._fail_deployment(dep, decision.reason)
        return False

    def _fail_deployment(self, dep: Deployment, reason: str) -> None:
        dep.status, dep.error = DeploymentStatus.FAILED, reason
        sched = self.groups[dep.group]
        for op in sched.withdraw(dep.id):
            self.counts["failed"] += 1
            self._end(self.ops[op.op_id], OpStatus.FAILED, error=f"{dep.id} failed: {reason}")
        if sched.resident == dep.id:
            sched.resident = None
        if self.placement.group_of(dep.id) is not None:
            self.placement.release(dep.id)
        self.counts["failed_deployments"] += 1
        log.error("deployment %s failed: %s", dep.id, reason)

    async def _watch(self) -> None:
        """Find groups whose ranks died while no operation of theirs ran, and recover them
        (under their group's lock, so never in the middle of another's switch); and node
        groups whose sidecar died, whose deployments then have no state manager."""
        while not self._closing:
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
        for dep in list(self.deployments.values()):
            if dep.status is not DeploymentStatus.READY or dep.migrating or dep.deleting:
                continue
            if dep.watched or dep.wpg.death() is None:
                continue
            dep.watched = True
            self._spawn(self._recover_dead(dep))

    async def _recover_node(self, group: int, why: str) -> None:
        """The node's sidecar died: the state it held is gone and its deployments' ranks can
        move no state. They are torn down and failed; the next deployment there starts a
        new sidecar."""
        try:
            async with self._locks[group]:
                log.error("%s: the state it held is lost", why)
                for dep in [d for d in self.deployments.values() if d.group == group]:
                    if dep.status is DeploymentStatus.READY and not dep.deleting:
                        await self._recover(dep, why)
                await self.launcher.forget_node(group)
                self._plans[group] = []
        finally:
            self._nodes_lost.discard(group)

    async def _recover_dead(self, dep: Deployment) -> None:
        try:
            async with self._locks[dep.group]:
                dead = dep.wpg.death()
                if dead is not None and dep.status is DeploymentStatus.READY:
                    await self._recover(dep, dead)
        finally:
            dep.watched = False

    def _new_id(self) -> int:
        self._last_id += 1
        return self._last_id

    def _end(self, rec: OpRecord, status: OpStatus, error: str | None = None) -> None:
        if rec.status.terminal:
            return
        rec.status, rec.error, rec.ended_s = status, error, self.now()
        rec.done.set()
        self._finished.append(rec.op_id)
        while len(self._finished) > self.retain_ops:  # what a finished op leaves is bounded
            self.ops.pop(self._finished.popleft(), None)
            self.forgotten += 1

    def _learn_switch(self, dep_id: str, took: float) -> None:
        old = self._switch.get(dep_id)
        self._switch[dep_id] = took if old is None else EWMA * took + (1 - EWMA) * old

    def _setup_estimate(self, job: str, resident: str | None) -> float:
        return self._switch.get(job, self.default_switch_s)

    async def wait(self, op_id: int, wait_s: float) -> OpRecord:
        rec = self.ops.get(op_id)
        if rec is None:
            if 0 <= op_id <= self._last_id:
                raise NotFound(
                    f"operation {op_id} finished and was forgotten (the service keeps the "
                    f"last {self.retain_ops}: retain_ops)"
                )
            raise NotFound(f"no operation {op_id}")
        if not rec.status.terminal and wait_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rec.done.wait(), wait_s)
        return rec

    # ---- views and lifecycle ---------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        by_status: dict[str, int] = {}
        for r in self.ops.values():
            by_status[r.status.value] = by_status.get(r.status.value, 0) + 1
        return {
            "policy": self.policy.value,
            "groups": [
                {
                    "group": g,
                    "resident": s.resident,
                    "running": None if s.running is None else s.running.op_id,
                    "queued": len(s.queue),
                    "deployments": sorted(d.id for d in self.deployments.values() if d.group == g),
                }
                for g, s in enumerate(self.groups)
            ],
            "deployments": {d.id: d.view() for d in self.deployments.values()},
            "ops": by_status,
            "counts": dict(self.counts),
        }

    async def close(self, grace_s: float = 10.0) -> None:
        """Stop: queued operations are cancelled, running ones get `grace_s` to finish (then
        their ranks are killed and they are cancelled), WPGs and sidecars stop."""
        self._closing = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        for s in self.groups:
            for dep_id in {o.job for o in s.queue}:
                for op in s.withdraw(dep_id):
                    self._end(self.ops[op.op_id], OpStatus.CANCELLED, error="the service stopped")
        loop = asyncio.get_running_loop()
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=grace_s)
            if late:
                running = {s.running.job for s in self.groups if s.running is not None}
                for dep in list(self.deployments.values()):
                    if dep.id in running:
                        await loop.run_in_executor(None, dep.wpg.kill)
                await asyncio.gather(*self._tasks, return_exceptions=True)
        for dep in list(self.deployments.values()):
            await loop.run_in_executor(None, dep.wpg.close)
        self.deployments.clear()
        await self.launcher.close()

    async def state_stats(self) -> dict[str, Any]:
        """What holds the deployments' state: each node group's sidecar (bytes by tier,
        moves, its plan, its deployments), or each deployment's on Ray."""
        return await self.launcher.stats({d.id: d.wpg for d in self.deployments.values()})
