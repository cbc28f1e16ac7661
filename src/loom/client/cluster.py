"""Client of `loom serve cluster` (PlexRL's remote execution API, §4.2): an RL job creates its
deployments and sends them operations; the service decides when each runs.

    async with ClusterClient(url) as cluster:
        job = await cluster.job("grpo-7b")
        actor = await job.deployment("actor", dp=2)
        async with job.phase("train"):              # the operations of one training phase
            await actor.call("forward_backward", ids=batch, advantages=adv)
            await actor.call("optim_step")
        await job.delete()

`call` submits an operation and waits for its result (`submit` + `result` do it in two steps).
`phase(name)` marks where a verl/ROLL-style loop hands a phase to the scheduler: it times the
phase and records the operations it sent, so the job's trace (what PlexRL's placement fits) is
known to the caller; `@phase_of(job, "train")` decorates a coroutine the same way, and
`@loom.phase("train")` does so for whichever job is active (`async with job:`) when it runs:

    @loom.phase("train")
    async def train(actor, batch): ...

    async with await cluster.job("grpo-7b") as job:
        await train(actor, batch)
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from loom.runtime.http_client import AsyncHttpClient, ServiceError, checked

__all__ = [
    "ClusterClient",
    "ClusterError",
    "DeploymentHandle",
    "JobHandle",
    "PhaseRecord",
    "phase",
    "phase_of",
]

P = ParamSpec("P")
R = TypeVar("R")


class ClusterError(ServiceError):
    """The cluster service refused a request, or an operation failed (its message says why)."""


def _check(resp: Any) -> Any:
    return checked(resp, ClusterError.of)


@dataclass
class PhaseRecord:
    name: str
    start_s: float
    end_s: float = 0.0
    ops: list[int] = field(default_factory=list)


class ClusterClient(AsyncHttpClient):
    def __init__(
        self, base_url: str, *, token: str | None = None, timeout_s: float = 600.0
    ) -> None:
        super().__init__(base_url, token=token, timeout_s=timeout_s)

    async def job(self, job_id: str) -> JobHandle:
        return JobHandle(self, job_id)

    async def stats(self) -> dict[str, Any]:
        return dict(_check(await self.http.get("/v1/stats")))

    async def op(self, op_id: int, wait_s: float = 0.0) -> dict[str, Any]:
        return dict(_check(await self.http.get(f"/v1/ops/{op_id}", params={"wait_s": wait_s})))

    async def state(self) -> dict[str, Any]:
        """What each node's StateManager sidecar holds (bytes by tier, moves, plan)."""
        return dict(_check(await self.http.get("/v1/state")))


@dataclass
class JobHandle:
    client: ClusterClient
    job_id: str
    phases: list[PhaseRecord] = field(default_factory=list)
    _current: PhaseRecord | None = None
    _tokens: list[contextvars.Token[JobHandle | None]] = field(default_factory=list)

    async def deployment(
        self,
        role: str = "actor",
        *,
        dp: int = 1,
        model: str = "tiny",
        model_options: dict[str, Any] | None = None,
        group: int | None = None,
        seed: int = 0,
        trace: dict[str, Any] | None = None,
        estimates: dict[str, float] | None = None,
    ) -> DeploymentHandle:
        """Start a deployment of `model`: "tiny" (the built-in decoder), a local Hugging Face
        model directory, or a worker class "module:Class" (`loom.runtime.cluster.models.
        ModelWorker`) built with `model_options`. On `group` if named, else where a profiled
        `trace` fits (PlexRL's placement), else on a group of its own while one is free.
        `estimates`: profiled seconds per operation kind, the scheduler's guess until it has
        measured."""
        body = {
            "job_id": self.job_id,
            "role": role,
            "model": model,
            "layout": {"dp": dp},
            "seed": seed,
            **({"model_options": model_options} if model_options is not None else {}),
            **({"group": group} if group is not None else {}),
            **({"trace": trace} if trace is not None else {}),
            **({"estimates": estimates} if estimates is not None else {}),
        }
        made = _check(await self.client.http.post("/v1/deployments", json=body))
        return DeploymentHandle(self, made["id"], int(made["group"]))

    async def __aenter__(self) -> JobHandle:
        """Make this the active job of `@loom.phase` coroutines run inside."""
        self._tokens.append(_ACTIVE.set(self))
        return self

    async def __aexit__(self, *exc: object) -> None:
        _ACTIVE.reset(self._tokens.pop())

    @contextlib.asynccontextmanager
    async def phase(self, name: str) -> AsyncIterator[PhaseRecord]:
        """One phase of the job's step (rollout, train, sync...): timed, its operations noted."""
        rec = PhaseRecord(name, time.monotonic())
        outer, self._current = self._current, rec
        try:
            yield rec
        finally:
            rec.end_s = time.monotonic()
            self.phases.append(rec)
            self._current = outer

    def trace(self, cycle: str, busy: tuple[str, ...]) -> dict[str, Any] | None:
        """The job's cycle as PlexRL's placement fits it (`DeploymentHandle.profile`): the
        period is the mean time between the starts of consecutive `cycle` phases; the segments
        are where, within a cycle, the phases named in `busy` ran (their mean offset and
        duration, whole seconds). None until two cycles have been seen."""
        starts = [p.start_s for p in self.phases if p.name == cycle]
        if len(starts) < 2:
            return None
        period = (starts[-1] - starts[0]) / (len(starts) - 1)
        spans: dict[str, list[tuple[float, float]]] = {}
        for p in self.phases:
            if p.name not in busy:
                continue
            base = max((s for s in starts if s <= p.start_s), default=None)
            if base is None:
                continue
            spans.setdefault(p.name, []).append((p.start_s - base, p.end_s - p.start_s))
        segments, end = [], 0
        for name in busy:
            got = spans.get(name)
            if not got:
                continue
            offset = max(end, round(sum(o for o, _ in got) / len(got)))
            dur = max(1, round(sum(d for _, d in got) / len(got)))
            segments.append([offset, dur])
            end = offset + dur
        period_s = max(end, round(period), 1)
        return {"period_s": period_s, "segments": segments} if segments else None

    async def delete(self) -> list[str]:
        return list(_check(await self.client.http.delete(f"/v1/jobs/{self.job_id}"))["deployments"])


@dataclass
class DeploymentHandle:
    job: JobHandle
    id: str
    group: int

    async def submit(self, op: str, *, deadline_s: float | None = None, **payload: Any) -> int:
        """Queue `op` with `payload`; `deadline_s`: how long it may run once started (the
        service's default: a multiple of its measured duration, with a floor)."""
        body: dict[str, Any] = {"op": op, "payload": payload}
        if deadline_s is not None:
            body["deadline_s"] = deadline_s
        op_id = int(
            _check(await self.job.client.http.post(f"/v1/deployments/{self.id}/ops", json=body))[
                "op_id"
            ]
        )
        if self.job._current is not None:
            self.job._current.ops.append(op_id)
        return op_id

    async def result(self, op_id: int, timeout_s: float = 600.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            view = await self.job.client.op(op_id, wait_s=max(0.0, min(30.0, left)))
            if view["status"] == "succeeded":
                return dict(view["result"])
            if view["status"] in ("failed", "cancelled"):
                raise ClusterError(
                    409 if view["status"] == "cancelled" else 500,
                    f"{view['op']} {view['status']}: {view['error']}",
                )
            if left <= 0:
                raise ClusterError(
                    504, f"operation {op_id} still {view['status']} after {timeout_s} s"
                )

    async def profile(self, trace: dict[str, Any]) -> dict[str, Any]:
        """Hand the service this deployment's profiled cycle (`JobHandle.trace`): PlexRL's
        placement fits it onto a node group (repacking a cold-started job)."""
        resp = await self.job.client.http.put(f"/v1/deployments/{self.id}/trace", json=trace)
        view = dict(_check(resp))
        self.group = int(view["group"])
        return view

    async def migrate(self, group: int) -> dict[str, Any]:
        """Move this deployment to node group `group`, its state with it."""
        resp = await self.job.client.http.post(
            f"/v1/deployments/{self.id}/migrate", json={"group": group}
        )
        view = dict(_check(resp))
        self.group = int(view["group"])
        return view

    async def call(
        self, op: str, *, deadline_s: float | None = None, **payload: Any
    ) -> dict[str, Any]:
        wait_s = 600.0 if deadline_s is None else max(600.0, deadline_s + 60.0)
        return await self.result(await self.submit(op, deadline_s=deadline_s, **payload), wait_s)


def phase_of(
    job: JobHandle, name: str
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Decorate a coroutine as one phase of `job` (`@phase_of(job, "train")`)."""

    def wrap(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(fn)
        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            async with job.phase(name):
                return await fn(*args, **kwargs)

        return run

    return wrap


_ACTIVE: contextvars.ContextVar[JobHandle | None] = contextvars.ContextVar(
    "loom_active_job", default=None
)


def phase(name: str) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Decorate a coroutine as one phase of the job active when it runs (`async with job:`)."""

    def wrap(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(fn)
        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            job = _ACTIVE.get()
            if job is None:
                raise RuntimeError(
                    f"{fn.__qualname__} is a {name!r} phase: run it inside `async with job:`"
                )
            async with job.phase(name):
                return await fn(*args, **kwargs)

        return run

    return wrap
