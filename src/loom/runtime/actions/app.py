"""The action server's HTTP API (FastAPI): submit, read, cancel actions; end trajectories."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.responses import Response

from loom._version import __version__
from loom.runtime.actions.config import ActionServerConfig
from loom.runtime.actions.driver import ActionDriver
from loom.runtime.actions.run_code import RunCodeRequest, RunCodeResponse, run_code
from loom.runtime.actions.schemas import (
    ActionAccepted,
    ActionRequest,
    ActionView,
    ServerStats,
    StatusName,
    TrajectoryEnded,
)
from loom.runtime.service import BearerToken, BodyLimit, add_error_handlers
from loom.runtime.web.probes import METRICS_CONTENT_TYPE, health

# BearerToken and BodyLimit moved to loom.runtime.service; still importable from here
__all__ = ["BearerToken", "BodyLimit", "create_app"]

MAX_WAIT_S = 60.0

_DESCRIPTION = """\
Runs tool and reward actions of RL rollouts on pooled resources — pinned CPU cores, GPU
services restored on demand, rate-limited APIs — scheduled by an action policy (ARL-Tangram's
elastic scheduler by default). Submit an action, then poll it (or long-poll with `wait_s`)
until its status is terminal: succeeded, failed, cancelled or timed_out.
"""


def _driver(request: Request) -> ActionDriver:
    driver: ActionDriver = request.app.state.driver
    return driver


Driver = Annotated[ActionDriver, Depends(_driver)]


def create_app(config: ActionServerConfig | None = None, *, trust_env: bool = True) -> FastAPI:
    """The app; its lifespan starts the driver and, on shutdown, stops every action.
    `trust_env=False` keeps API actions away from proxy settings in the environment."""
    cfg = config or ActionServerConfig()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        driver = ActionDriver(cfg, trust_env=trust_env)
        await driver.start()
        app.state.driver = driver
        try:
            yield
        finally:
            await driver.close()

    app = FastAPI(
        title="Loom action server",
        version=__version__,
        description=_DESCRIPTION,
        lifespan=lifespan,
    )
    _add_error_handlers(app)
    _add_routes(app)
    app.add_middleware(BodyLimit, max_bytes=cfg.max_body_bytes)
    if cfg.token is not None:
        app.add_middleware(BearerToken, token=cfg.token, open_health=cfg.open_health)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    add_error_handlers(app)


def _add_routes(app: FastAPI) -> None:
    @app.get("/healthz", tags=["server"])
    async def healthz() -> dict[str, str]:
        return health()

    @app.get("/metrics", tags=["server"], response_class=Response)
    async def metrics(driver: Driver) -> Response:
        """Prometheus: queued, running, busy cores, ACT by kind, failures by reason."""
        return Response(driver.metrics_text(), media_type=METRICS_CONTENT_TYPE)

    @app.get("/v1/stats", tags=["server"])
    async def stats(driver: Driver) -> ServerStats:
        return driver.stats()

    @app.post("/v1/actions", status_code=202, tags=["actions"])
    async def submit(body: ActionRequest, driver: Driver) -> ActionAccepted:
        """Queue an action. 422 when it is malformed or could never run here."""
        rec = driver.submit(body)
        return ActionAccepted(id=rec.id, status=StatusName.of(rec.status))

    @app.get("/v1/actions/{action_id}", tags=["actions"])
    async def get_action(
        action_id: str,
        driver: Driver,
        wait_s: Annotated[
            float, Query(ge=0, le=MAX_WAIT_S, description="wait up to this long for the end")
        ] = 0.0,
    ) -> ActionView:
        rec = driver.get(action_id)
        if wait_s > 0 and not rec.status.terminal:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rec.done.wait(), wait_s)
        return rec.view(driver.clock)

    @app.delete("/v1/actions/{action_id}", tags=["actions"])
    async def cancel_action(action_id: str, driver: Driver) -> ActionView:
        """Cancel a queued action or kill a running one (its view, now cancelled); a finished
        one is forgotten (its last view; a later GET is 404)."""
        rec = driver.get(action_id)
        if rec.status.terminal:
            return driver.delete(action_id).view(driver.clock)
        rec = await driver.cancel(action_id)
        return rec.view(driver.clock)

    @app.post("/run_code", tags=["sandboxfusion"])
    async def run_code_route(body: RunCodeRequest, driver: Driver) -> RunCodeResponse:
        """SandboxFusion's single-snippet route (python, bash): runs it as a contained CPU
        action and answers when it has finished."""
        return await run_code(driver, body)

    @app.post("/v1/trajectories/{trajectory_id}/end", tags=["trajectories"])
    async def end_trajectory(
        trajectory_id: Annotated[
            str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
        ],
        driver: Driver,
    ) -> TrajectoryEnded:
        """Cancel the trajectory's unfinished actions and free its workspace and pins."""
        return await driver.end_trajectory(trajectory_id)
