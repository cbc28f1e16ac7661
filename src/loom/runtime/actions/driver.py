"""The action server's driver: one asyncio loop that owns the action policy. On every submit,
finish and policy wakeup it asks `schedule(now)` which actions start, then launches each
`Start` on what it was granted — cores, a GPU chunk, an API slot. The policy decides; this
module only acts, and checks that what it is told to do is possible."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Callable, Mapping

from loom.actions.managers.base import ResourceManager
from loom.actions.managers.basic import ApiLimit, BasicManager
from loom.actions.managers.cpu import CpuManager
from loom.actions.managers.gpu import GpuManager
from loom.actions.policy import ACTION_POLICIES, ActionPolicy, ActionPolicyKind, Start
from loom.actions.tangram import scheduler as _tangram  # noqa: F401 - registers the policies
from loom.core.actions import ActionKind, ActionStatus
from loom.core.errors import ConfigError, NotFound, Unavailable, UnknownPolicyError
from loom.core.resources import api_quota
from loom.runtime.actions.api_call import ApiExecutor
from loom.runtime.actions.cgroups import Cgroups, probe_cgroups
from loom.runtime.actions.claims import Claims
from loom.runtime.actions.config import ActionServerConfig, SandboxKind
from loom.runtime.actions.executor import ExecContext, Executor
from loom.runtime.actions.formulate import formulate
from loom.runtime.actions.history import DurationHistory
from loom.runtime.actions.host import local_cpu_node
from loom.runtime.actions.metrics import ActionMetrics
from loom.runtime.actions.process import ProcessExecutor
from loom.runtime.actions.record import ActionRecord, Clock, Outcome
from loom.runtime.actions.sandbox import Bubblewrap, probe_bubblewrap
from loom.runtime.actions.schemas import ActionRequest, CpuRange, ServerStats, TrajectoryEnded
from loom.runtime.actions.service_host import ServiceHost
from loom.runtime.actions.service_models import TORCH_HINT, torch_available
from loom.runtime.actions.workspace import Workspaces
from loom.runtime.reaper import Reaper

__all__ = ["ActionDriver", "ServerClosingError", "UnknownActionError", "policy_factory"]

log = logging.getLogger(__name__)

_MIN_SLEEP_S = 1e-3  # never spin when a wakeup time has just passed


def policy_factory(kind: ActionPolicyKind) -> Callable[..., ActionPolicy]:
    """The registered factory of an action policy (taking the managers); ConfigError when the
    policy has no implementation the server can drive."""
    try:
        return ACTION_POLICIES.get(kind)
    except UnknownPolicyError as exc:
        raise ConfigError(str(exc)) from None


class ServerClosingError(Unavailable):
    """The server is shutting down and accepts no more actions."""


class UnknownActionError(NotFound):
    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown action"


class ActionDriver:
    """Builds the managers and the policy from a config, and runs actions for real."""

    def __init__(self, config: ActionServerConfig, *, trust_env: bool = True) -> None:
        self.config = config
        self.clock = Clock()
        self.node = local_cpu_node(config.cores, config.memory_gb)
        self.cpu = CpuManager([self.node])
        self.basic = BasicManager(
            [
                ApiLimit(
                    key=api_quota(a.name),
                    concurrency=a.concurrency,
                    quota=a.quota,
                    period_s=a.period_s,
                )
                for a in config.api
            ]
        )
        self.services, self.gpu, self.gpu_note = self._gpu_services(config)
        managers: list[ResourceManager] = [self.cpu, self.basic]
        if self.gpu is not None:
            managers.append(self.gpu)
        self.policy: ActionPolicy = policy_factory(config.policy)(
            managers, backfill_s=config.backfill_s
        )
        self.workspaces = Workspaces(config.workdir)
        self.sandbox, self._notes = self._sandbox(config)
        self.cgroups: Cgroups | None = None  # at start()
        self._reaper: Reaper | None = None  # at start()
        self.processes = ProcessExecutor(
            config.max_output_bytes, sandbox=self.sandbox, linger_s=config.linger_s
        )
        self._executors: dict[ActionKind, Executor] = {
            ActionKind.CPU_TOOL: self.processes,
            ActionKind.API: ApiExecutor(config.max_output_bytes, trust_env=trust_env),
        }
        if self.services is not None:
            self._executors[ActionKind.GPU_SERVICE] = self.services
        self._records: dict[str, ActionRecord] = {}
        self.metrics = ActionMetrics()
        self._live: dict[str, set[str]] = {}  # trajectory -> its actions not yet terminal
        self._done: deque[str] = deque()  # terminal actions, oldest first
        self._by_trajectory: dict[str, set[str]] = {}  # trajectory -> its records
        self._activity: dict[str, float] = {}  # trajectory -> its last submit or end
        self._housekeeper: asyncio.Task[None] | None = None
        self._tasks: dict[str, asyncio.Task[Outcome]] = {}
        self._cancel_reason: dict[str, str] = {}
        self._claims = Claims(c for dom in self.node.numa for c in dom)
        self._history = DurationHistory()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._closing = False

    def _sandbox(self, config: ActionServerConfig) -> tuple[Bubblewrap | None, list[str]]:
        """Bubblewrap; a ConfigError when asked for and unusable: the server must not start."""
        if config.sandbox is SandboxKind.BWRAP:
            box = probe_bubblewrap(hide=(self.workspaces.root,), binds=config.sandbox_ro_binds)
            return box, []
        note = "--sandbox none: actions see the whole machine and the network"
        log.warning("running actions without a sandbox: %s", note)
        return None, [note]

    def _cgroups(self, config: ActionServerConfig) -> tuple[Cgroups | None, list[str]]:
        """This instance's cgroups where the machine allows (said once, and in /v1/stats,
        where not); created at start, removed at close."""
        if not config.cgroups:
            return None, ["cgroups are off: detached children may outlive their action"]
        cgroups, why = probe_cgroups(config.pids_max)
        if cgroups is not None:
            return cgroups, []
        log.warning("running actions without cgroups: %s", why)
        return None, [
            f"no cgroups ({why}): memory is limited per process, and detached children "
            "may outlive their action"
        ]

    @staticmethod
    def _gpu_services(
        config: ActionServerConfig,
    ) -> tuple[ServiceHost | None, GpuManager | None, str | None]:
        if not config.services:
            return None, None, "this server has no GPU services configured"
        if not torch_available():
            log.warning("GPU services are configured but torch is missing; serving without them")
            return None, None, TORCH_HINT
        host = ServiceHost(config.services, config.gpu_nodes)
        return host, GpuManager(host.gpu_nodes(), host.service_specs()), None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        assert self._loop_task is None, "the driver is already started"
        self.cgroups, notes = await asyncio.to_thread(self._cgroups, self.config)
        self.processes.cgroups = self.cgroups
        self._reaper = await asyncio.to_thread(
            Reaper.start,
            cgroups=None if self.cgroups is None else self.cgroups.spec(),
            remove=(self.workspaces.root,) if self.workspaces.owned else (),
        )
        self.processes.reaper = self._reaper
        self._notes += notes
        self._loop_task = asyncio.create_task(self._loop(), name="action-scheduler")
        self._housekeeper = asyncio.create_task(self._housekeeping(), name="action-housekeeping")

    async def close(self) -> None:
        """Stop: queued actions become cancelled, running ones are killed (cancelled)."""
        if self._closing:
            return
        self._closing = True
        if self._housekeeper is not None:
            self._housekeeper.cancel()
            await asyncio.gather(self._housekeeper, return_exceptions=True)
        now = self.clock.now()
        for rec in [r for r in self._records.values() if r.status is ActionStatus.QUEUED]:
            self._drop_queued(rec, "the server shut down", now)
        tasks = list(self._tasks.items())
        for aid, task in tasks:
            self._cancel_reason[aid] = "the server shut down"
            task.cancel()
        await asyncio.gather(*(t for _, t in tasks), return_exceptions=True)
        await asyncio.sleep(0)  # let the done-callbacks record the outcomes
        if self.cgroups is not None:
            await asyncio.to_thread(self.cgroups.close)
        if self._loop_task is not None:
            # NOTE: cancelled rather than woken: on a forced exit asyncio may already have
            # cancelled it, and either way it must not raise here.
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        for ex in self._executors.values():
            await ex.close()
        self.workspaces.close()
        if self._reaper is not None:
            await asyncio.to_thread(self._reaper.close)
        lost = [r.id for r in self._records.values() if not r.status.terminal]
        assert not lost, f"actions left without a terminal state: {lost}"

    # -- client operations -----------------------------------------------------------------
    def submit(self, request: ActionRequest) -> ActionRecord:
        """Accept an action (it is queued); ConfigError when it can never run here."""
        if self._closing:
            raise ServerClosingError("the action server is shutting down")
        self._check(request)
        aid = f"act-{uuid.uuid4().hex}"
        spec = formulate(
            request,
            aid,
            max_cores=self.node.num_cores,
            t_ori_default=self._history.t_ori_s(request.kind),
        )
        now = self.clock.now()
        self.policy.submit(spec, now)
        rec = ActionRecord(spec=spec, request=request, submitted=now)
        self._records[aid] = rec
        self._live.setdefault(spec.trajectory_id, set()).add(aid)
        self._by_trajectory.setdefault(spec.trajectory_id, set()).add(aid)
        self._activity[spec.trajectory_id] = now
        self._wake.set()
        return rec

    def get(self, action_id: str) -> ActionRecord:
        try:
            return self._records[action_id]
        except KeyError:
            raise UnknownActionError(f"no action {action_id!r}") from None

    async def cancel(self, action_id: str, reason: str = "cancelled by the client") -> ActionRecord:
        """Cancel a queued action, or kill a running one and wait until it is stopped."""
        rec = self.get(action_id)
        if rec.status is ActionStatus.QUEUED:
            self._drop_queued(rec, reason, self.clock.now())
        elif rec.status is ActionStatus.RUNNING:
            task = self._tasks[action_id]
            self._cancel_reason.setdefault(action_id, reason)
            task.cancel()
            await rec.done.wait()
        return rec

    def delete(self, action_id: str) -> ActionRecord:
        """Forget a terminal action (ConfigError if it has not ended)."""
        rec = self.get(action_id)
        if not rec.status.terminal:
            raise ConfigError(f"action {action_id} has not ended; DELETE cancels it first")
        self._forget(action_id)
        return rec

    def _forget(self, action_id: str) -> None:
        rec = self._records.pop(action_id, None)
        if rec is None:
            return
        tid = rec.spec.trajectory_id
        mine = self._by_trajectory.get(tid)
        if mine is not None:
            mine.discard(action_id)
            if not mine:
                del self._by_trajectory[tid]

    async def end_trajectory(
        self, trajectory_id: str, reason: str = "the trajectory ended"
    ) -> TrajectoryEnded:
        """Cancel the trajectory's unfinished actions; free its pins, memory, workspace and
        the records of its actions."""
        live = sorted(self._live.get(trajectory_id, ()))
        await asyncio.gather(*(self.cancel(a, reason) for a in live))
        for aid in list(self._by_trajectory.get(trajectory_id, ())):
            self._forget(aid)
        self._activity.pop(trajectory_id, None)
        self.policy.end_trajectory(trajectory_id, self.clock.now())
        await asyncio.to_thread(self.processes.end_trajectory, trajectory_id)
        removed = await asyncio.to_thread(self.workspaces.remove, trajectory_id)
        self._wake.set()
        return TrajectoryEnded(
            trajectory_id=trajectory_id, cancelled=live, workspace_removed=removed
        )

    def _counts(self) -> dict[ActionStatus, int]:
        counts = {s: 0 for s in ActionStatus}
        for r in self._records.values():
            counts[r.status] += 1
        return counts

    def metrics_text(self) -> bytes:
        """Prometheus' text format: queue, running, busy cores, ACT by kind, failures."""
        counts = self._counts()
        return self.metrics.render(
            counts[ActionStatus.QUEUED], counts[ActionStatus.RUNNING], len(self._claims.busy_cores)
        )

    def stats(self) -> ServerStats:
        counts = self._counts()
        api = {
            key.removeprefix("api:"): {
                "concurrency": lim.concurrency,
                "in_use": self.basic.in_use(key),
                "quota": lim.quota,
                "period_s": lim.period_s,
            }
            for key, lim in self.basic.limits.items()
        }
        resident = [] if self.services is None else self.services.resident()
        return ServerStats(
            policy=self.config.policy.value,
            queued=counts[ActionStatus.QUEUED],
            running=counts[ActionStatus.RUNNING],
            finished=sum(n for s, n in counts.items() if s.terminal),
            cores=sorted(self._claims.cores),
            busy_cores=sorted(self._claims.busy_cores),
            api=api,
            services=[] if self.gpu is None else sorted(self.gpu.services),
            resident=[
                {"node": i.node, "service": i.service, "dop": i.dop, "start": i.start}
                for i in resident
            ],
            gpu_services_available=self.gpu is not None,
            gpu_services_note=self.gpu_note,
            sandbox=self.config.sandbox.value,
            cgroups=None if self.cgroups is None else self.cgroups.version,
            containment_note="; ".join(self._notes) or None,
        )

    # -- checks the managers cannot make ---------------------------------------------------
    def _check(self, request: ActionRequest) -> None:
        if request.network and not self.config.network:
            raise ConfigError("this server gives actions no network (started with --no-network)")
        if request.command is not None:
            least = request.cpu.min if isinstance(request.cpu, CpuRange) else request.cpu
            if least > self.node.num_cores:
                raise ConfigError(
                    f"the action needs {least} cores; this server has {self.node.num_cores} "
                    f"(cores {sorted(self._claims.cores)})"
                )
            if request.memory_gb is not None and request.memory_gb > self.node.memory_gb:
                raise ConfigError(
                    f"the action needs {request.memory_gb:g} GB; this server has "
                    f"{self.node.memory_gb:g} GB for environments"
                )
        if request.service is not None:
            if self.services is None or self.gpu is None:
                raise ConfigError(f"unknown service {request.service.name!r}: {self.gpu_note}")
            if request.service.name not in self.gpu.services:
                known = ", ".join(sorted(self.gpu.services))
                raise ConfigError(f"unknown service {request.service.name!r} (known: {known})")
            self.services.check_input(request.service.name, request.service.input)
        if request.api is not None and api_quota(request.api.name) not in self.basic.limits:
            known = ", ".join(k.removeprefix("api:") for k in self.basic.limits) or "none"
            raise ConfigError(f"unknown API quota {request.api.name!r} (known: {known})")

    # -- the scheduling loop ---------------------------------------------------------------
    async def _loop(self) -> None:
        while not self._closing:
            now = self.clock.now()
            self._schedule(now)
            wake_at = self.policy.next_wakeup(now)
            timeout = None if wake_at is None else max(wake_at - self.clock.now(), _MIN_SLEEP_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()

    def _schedule(self, now: float) -> None:
        try:
            starts = self.policy.schedule(now)
        except Exception:  # a policy bug must not stop the server; retry at the next event
            log.exception("the action policy failed to schedule")
            return
        if self.gpu is not None and self.services is not None:
            for node in self.gpu.nodes:  # drop the device copies the manager evicted
                self.services.sync(node.name, self.gpu.cached(node.name))
        for start in starts:
            try:
                self._launch(start, now)
            except Exception as exc:  # a broken grant fails its action, not the server
                log.exception("cannot launch action %s", start.action.action_id)
                self._abort(start, exc, now)

    def _launch(self, start: Start, now: float) -> None:
        aid = start.action.action_id
        rec = self._records[aid]
        tid = start.action.trajectory_id
        cpu = start.action.kind is ActionKind.CPU_TOOL
        workspace = self.workspaces.open(tid) if cpu else self.workspaces.path(tid)
        self._claims.claim(start)
        rec.mark_scheduled(start, now)
        ctx = ExecContext(
            request=rec.request,
            start=start,
            timeout_s=rec.request.timeout_s or self.config.default_timeout_s,
            workspace=workspace,
            started=lambda: rec.mark_started(self.clock.now()),
        )
        executor = self._executors[start.action.kind]
        task = asyncio.create_task(executor.run(ctx), name=f"action {aid}")
        task.add_done_callback(lambda t: self._finished(rec, start, t))
        self._tasks[aid] = task

    def _finished(self, rec: ActionRecord, start: Start, task: asyncio.Task[Outcome]) -> None:
        """A launched action ended, however: release its resources, record its outcome."""
        aid = rec.id
        if task.cancelled():
            outcome = Outcome(
                status=ActionStatus.CANCELLED,
                error=self._cancel_reason.pop(aid, "cancelled"),
            )
        elif (exc := task.exception()) is not None:
            log.error("action %s failed in the server", aid, exc_info=exc)
            outcome = Outcome(status=ActionStatus.FAILED, error=f"server error: {exc!r}")
        else:
            outcome = task.result()
        self._cancel_reason.pop(aid, None)
        now = self.clock.now()
        del self._tasks[aid]
        self._claims.release(start)
        try:
            self.policy.finish(aid, now)
        finally:
            rec.finish(outcome, now)
            self._retire(rec)
            self._wake.set()
        if outcome.status is ActionStatus.SUCCEEDED and rec.started is not None:
            self._history.add(start.action, start.units, now - rec.started)

    def _abort(self, start: Start, exc: Exception, now: float) -> None:
        aid = start.action.action_id
        self.policy.finish(aid, now)
        rec = self._records[aid]
        if aid not in self._tasks and not rec.status.terminal:
            rec.finish(Outcome(status=ActionStatus.FAILED, error=f"server error: {exc!r}"), now)
            self._retire(rec)

    def _drop_queued(self, rec: ActionRecord, reason: str, now: float) -> None:
        dropped = self.policy.cancel(rec.id)
        assert dropped, f"{rec.id} is queued here but not in the policy"
        rec.finish(Outcome(status=ActionStatus.CANCELLED, error=reason), now)
        self._retire(rec)
        self._wake.set()  # FCFS: what waited behind it may start now

    def _retire(self, rec: ActionRecord) -> None:
        self.metrics.record(rec)
        live = self._live.get(rec.spec.trajectory_id)
        if live is not None:
            live.discard(rec.id)
            if not live:
                del self._live[rec.spec.trajectory_id]
        self._activity[rec.spec.trajectory_id] = self.clock.now()
        self._done.append(rec.id)
        while len(self._done) > self.config.retain_max:
            self._forget(self._done.popleft())

    async def _housekeeping(self) -> None:
        """Forget records past `retain_s`; end trajectories idle past `trajectory_idle_s`."""
        period = min(max(min(self.config.retain_s, self.config.trajectory_idle_s) / 4, 0.05), 5.0)
        while True:
            await asyncio.sleep(period)
            now = self.clock.now()
            while self._done and (
                (rec := self._records.get(self._done[0])) is None
                or rec.finished is None
                or now - rec.finished > self.config.retain_s
            ):
                self._forget(self._done.popleft())
            idle = [
                t
                for t, at in self._activity.items()
                if t not in self._live and now - at > self.config.trajectory_idle_s
            ]
            for tid in idle:
                log.info("trajectory %s idle for %g s: ending it", tid, now - self._activity[tid])
                await self.end_trajectory(tid, "the trajectory was idle")

    @property
    def records(self) -> Mapping[str, ActionRecord]:
        return self._records
