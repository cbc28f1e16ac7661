"""`loom serve cluster`: PlexRL's Scheduler and Router as one service (§4.1, §5.1). RL jobs
create deployments (a worker-process group each, on a node group) and send their operations;
the service admits them per node group under its operation policy and forwards them.

Routes: `POST /v1/deployments`, `POST /v1/deployments/{id}/ops` (202 with an op id),
`GET /v1/ops/{id}?wait_s=`, `PUT /v1/deployments/{id}/trace` (repack),
`POST /v1/deployments/{id}/migrate`, `DELETE /v1/jobs/{id}`, `GET /v1/stats`, `GET /v1/state`
(what each node's StateManager sidecar holds), `GET /metrics`, `GET /healthz`.

A deployment's `model` is "tiny" (the built-in decoder), a local Hugging Face model directory,
or a worker class `module:Class` (`models.ModelWorker`), built with `model_options`. A model it
cannot be is a 400; so is a payload the deployment's model cannot run (token ids outside its
vocabulary, a ragged batch, a field of the wrong type or of no use to the operation), and a
model the workers cannot build as named (not a ModelWorker, options it does not take); workers
that fail to start otherwise are a 503 with their error. An operation of a failed deployment
is a 409 with why it failed.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Query
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Gauge
from pydantic import BaseModel, ConfigDict, Field

from loom.cluster.faults import DeadlinePolicy, RecoveryPolicy
from loom.cluster.plexrl.hrrs import OpPolicyKind
from loom.cluster.plexrl.timeline import HORIZON_SLOTS, Footprint
from loom.core.errors import ConfigError, InvalidRequest
from loom.runtime.access import Access
from loom.runtime.cluster.driver import ClusterDriver
from loom.runtime.cluster.models.ref import BUILTIN_MODEL
from loom.runtime.service import (
    BackgroundApp,
    BearerToken,
    BodyLimit,
    DriverServer,
    add_error_handlers,
    run_app,
)
from loom.runtime.web.asgi import metrics_response
from loom.runtime.web.probes import health
from loom.state.sidecar import SidecarConfig

__all__ = ["BackgroundCluster", "ClusterConfig", "create_app", "serve"]

Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class ClusterConfig(Access):
    model_config = ConfigDict(extra="forbid", frozen=True)
    host: str = "127.0.0.1"
    port: int = Field(default=8900, ge=0, le=65535)
    groups: int = Field(default=1, ge=1, le=1024, description="node groups (a WPG runs on one)")
    policy: OpPolicyKind = OpPolicyKind.HRRS
    state_dir: Path | None = None
    max_body_bytes: int = Field(default=64 << 20, ge=1024)
    launcher: Literal["process", "ray"] = Field(
        default="process", description="worker processes here, or Ray actors in placement groups"
    )
    gpus_per_rank: float = Field(default=0.0, ge=0, description="GPUs each rank asks Ray for")
    gpus_per_group: int = Field(default=8, ge=1, le=1024, description="GPUs of a node group")
    device_bytes: int | None = Field(
        default=None, ge=0, description="a GPU's memory for state (default: all of it)"
    )
    host_bytes: int = Field(default=1 << 30, ge=0, description="a node's host tier")
    disk_bytes: int = Field(default=4 << 30, ge=0, description="a node's disk tier")
    deadline_factor: float = Field(
        default=10.0, ge=1, le=1e6, description="an operation's deadline: this × its duration"
    )
    deadline_floor_s: float = Field(
        default=120.0, gt=0, le=1e6, description="no operation's deadline is shorter"
    )
    settle_s: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="after a rank raised, how long the others have to answer before the "
        "group is torn down",
    )
    watch_s: float = Field(
        default=1.0,
        ge=0,
        le=3600,
        description="how often idle worker groups are checked for dead ranks (0: only when "
        "they are next used)",
    )
    retain_ops: int = Field(
        default=10_000,
        ge=1,
        description="finished operations remembered with their results; the oldest beyond "
        "are forgotten (memory stays bounded)",
    )
    max_restarts: int = Field(
        default=3, ge=0, le=1000, description="restarts of a deployment from its offloaded state"
    )
    faults: bool = Field(default=False, description="tests only: accept the inject_fault operation")


class _Layout(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dp: int = Field(default=1, ge=1, le=64)


class _Trace(BaseModel):
    """A job's profiled cycle on its node group (§4.3.2): its period and the segments (offset,
    duration in seconds) its operations keep the group busy within it."""

    model_config = ConfigDict(extra="forbid")
    period_s: int = Field(ge=1, le=HORIZON_SLOTS)
    segments: list[tuple[int, int]] = Field(min_length=1, max_length=1024)

    def footprint(self) -> Footprint:
        try:
            return Footprint(tuple(self.segments), period=self.period_s)
        except ConfigError as exc:
            raise InvalidRequest(f"invalid trace: {exc}") from None


class _Deployment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job_id: Name
    model: str = Field(
        default=BUILTIN_MODEL,
        min_length=1,
        max_length=4096,
        description=f"what it runs: {BUILTIN_MODEL!r} (the built-in tiny decoder), a local "
        "Hugging Face model directory, or a worker class `module:Class`",
    )
    model_options: dict[str, Any] | None = Field(
        default=None, description="keywords its worker class is built with (JSON values)"
    )
    role: Name = "actor"
    layout: _Layout = Field(default_factory=_Layout)
    group: int | None = Field(default=None, ge=0)
    seed: int = 0
    trace: _Trace | None = None
    estimates: dict[str, float] | None = Field(
        default=None, description="profiled seconds per operation kind (HRRS's E until measured)"
    )


class _Migrate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group: int = Field(ge=0)


class _Op(BaseModel):
    model_config = ConfigDict(extra="forbid")
    op: str
    payload: dict[str, Any] = Field(default_factory=dict)
    deadline_s: float | None = Field(
        default=None, gt=0, le=1e6, description="how long it may run (default: the service's)"
    )


def _deployment_view(dep: Any) -> dict[str, Any]:
    view: dict[str, Any] = dep.view()
    view["job_id"] = view.pop("job")
    return view


def create_app(config: ClusterConfig, driver: ClusterDriver | None = None) -> FastAPI:
    registry = CollectorRegistry()
    ops_seen = Gauge(
        "loom_cluster_ops",
        "operations accepted, by kind and status",
        ["op", "status"],
        registry=registry,
    )
    queued = Gauge(
        "loom_cluster_queued", "operations queued per node group", ["group"], registry=registry
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        app.state.driver = driver or ClusterDriver(
            groups=config.groups,
            policy=config.policy,
            state_dir=config.state_dir,
            launcher=config.launcher,
            gpus_per_rank=config.gpus_per_rank,
            gpus_per_group=config.gpus_per_group,
            state=SidecarConfig(
                device_bytes=config.device_bytes,
                host_bytes=config.host_bytes,
                disk_bytes=config.disk_bytes,
            ),
            deadlines=DeadlinePolicy(
                factor=config.deadline_factor, floor_s=config.deadline_floor_s
            ),
            recovery=RecoveryPolicy(max_restarts=config.max_restarts),
            settle_s=config.settle_s,
            watch_s=config.watch_s,
            faults=config.faults,
            retain_ops=config.retain_ops,
        )
        yield
        await app.state.driver.close()

    app = FastAPI(title="loom cluster", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    if config.token is not None:
        app.add_middleware(BearerToken, token=config.token, open_health=config.open_health)
    add_error_handlers(app)

    def drv() -> ClusterDriver:
        d: ClusterDriver = app.state.driver
        return d

    @app.post("/v1/deployments", status_code=201)
    async def create_deployment(body: _Deployment) -> dict[str, Any]:
        trace = body.trace.footprint() if body.trace is not None else None
        dep = await drv().create(
            job_id=body.job_id,
            model=body.model,
            role=body.role,
            dp=body.layout.dp,
            group=body.group,
            seed=body.seed,
            trace=trace,
            estimates=body.estimates,
            model_options=body.model_options,
        )
        return _deployment_view(dep)

    @app.put("/v1/deployments/{dep_id}/trace")
    async def repack(dep_id: str, body: _Trace) -> dict[str, Any]:
        dep = await drv().repack(dep_id, body.footprint())
        return _deployment_view(dep)

    @app.post("/v1/deployments/{dep_id}/migrate")
    async def migrate(dep_id: str, body: _Migrate) -> dict[str, Any]:
        dep = await drv().migrate(dep_id, body.group)
        return _deployment_view(dep)

    @app.post("/v1/deployments/{dep_id}/ops", status_code=202)
    async def submit(dep_id: str, body: _Op) -> dict[str, Any]:
        rec = drv().submit(dep_id, body.op, body.payload, deadline_s=body.deadline_s)
        return {"op_id": rec.op_id, "status": rec.status.value}

    @app.get("/v1/ops/{op_id}")
    async def get_op(
        op_id: int, wait_s: Annotated[float, Query(ge=0, le=600)] = 0.0
    ) -> dict[str, Any]:
        rec = await drv().wait(op_id, wait_s)
        return rec.view()

    @app.delete("/v1/jobs/{job_id}")
    async def delete_job(job_id: str) -> dict[str, Any]:
        gone = await drv().delete_job(job_id)
        return {"job_id": job_id, "deployments": gone}

    @app.get("/v1/stats")
    async def stats() -> dict[str, Any]:
        return drv().stats()

    @app.get("/v1/state")
    async def state() -> dict[str, Any]:
        return await drv().state_stats()

    @app.get("/metrics")
    async def metrics() -> Response:
        for g, s in enumerate(drv().groups):
            queued.labels(str(g)).set(len(s.queue))
        counts: dict[tuple[str, str], int] = {}
        for r in drv().ops.values():
            counts[(r.kind, r.status.value)] = counts.get((r.kind, r.status.value), 0) + 1
        for (kind, status), n in counts.items():
            ops_seen.labels(kind, status).set(n)
        return metrics_response(registry)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return health()

    return app


class BackgroundCluster(BackgroundApp):
    """`loom serve cluster` in a daemon thread on a free port; a context manager."""

    def __init__(self, config: ClusterConfig, *, log_level: str = "warning") -> None:
        super().__init__(
            create_app(config),
            config.host,
            config.port,
            name="cluster service",
            log_level=log_level,
        )


def serve(config: ClusterConfig, log_level: str = "info", on_bound: Any = None) -> None:
    """Serve until interrupted; queued operations are cancelled and WPGs stop on the way out."""
    app = create_app(config)
    run_app(
        app,
        config.host,
        config.port,
        log_level=log_level,
        on_bound=on_bound,
        server=lambda cfg: DriverServer(cfg, app),
    )
