"""The rollout router's HTTP API (aiohttp: a lean request path, see DESIGN's router targets).

Inference, in the dialects clients already speak: `POST /v1/completions`,
`POST /v1/chat/completions`, `GET /v1/models` (OpenAI, vLLM's fields) and `POST /generate`
(SGLang's native token-in/token-out). Rollout control: `POST /v1/rollouts` declares a batch,
`POST /v1/trajectories/{id}/end` ends one, `GET /v1/trajectories/{id}` reads one. Engines:
`GET/POST /v1/engines`, `DELETE /v1/engines/{id}`, `PATCH /v1/engines/{id}` (what an engine's
side reports: its weight version; a lent engine's room and serving slack), `PUT /v1/weights`
(the current weight version), and the same registry shaped like SGLang's
gateway (`GET/POST /workers`, `DELETE /workers/{id}`, `GET /v1/loads`) so launchers that
register workers there work unchanged. Observability: `GET /v1/stats`, `GET /metrics`,
`GET /health`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loom.runtime.rollout.config import EngineConfig, RolloutServerConfig
from loom.runtime.rollout.driver import (
    BatchEntry,
    Conflict,
    NoEngine,
    RolloutDriver,
    UnknownEngine,
    UnknownTrajectory,
    stable_id,
)
from loom.runtime.rollout.engines import EngineError, EngineRejected
from loom.runtime.rollout.protocol import (
    BadRequest,
    Call,
    Dialect,
    error_body,
    parse_body,
    parse_call,
    render_chunk,
    render_full,
    render_usage_chunk,
    trajectory_key,
)
from loom.runtime.rollout.state import Turn

__all__ = ["DRIVER", "create_app"]

DRIVER = web.AppKey("driver", RolloutDriver)
_dumps = json.dumps


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=_dumps(data).encode(), status=status, content_type="application/json")


def _error(message: str, status: int) -> web.Response:
    return _json(error_body(message, status), status)


class _Declared(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=256)
    prompt_id: int | str | None = None
    prompt: str | None = None
    prompt_tokens: int = Field(default=0, ge=0)
    group: str | None = None


class _Report(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int | None = Field(default=None, ge=0)
    free_tokens: int | None = Field(default=None, ge=0)
    slack_s: float | None = Field(default=None, allow_inf_nan=False)


class _Weights(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=0)
    engines: list[str] = Field(default_factory=list, max_length=100_000)


class _Batch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    trajectories: list[_Declared] = Field(min_length=1, max_length=100_000)


def create_app(config: RolloutServerConfig, driver: RolloutDriver | None = None) -> web.Application:
    app = web.Application(client_max_size=int(config.max_body_mb * 2**20), middlewares=[_errors])
    app[DRIVER] = driver or RolloutDriver(config)

    async def on_startup(app: web.Application) -> None:
        await app[DRIVER].start()

    async def on_cleanup(app: web.Application) -> None:
        await app[DRIVER].close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    r = app.router
    r.add_post("/v1/completions", _inference(Dialect.COMPLETIONS))
    r.add_post("/v1/chat/completions", _inference(Dialect.CHAT))
    r.add_post("/generate", _inference(Dialect.GENERATE))
    r.add_get("/v1/models", models)
    r.add_post("/v1/rollouts", declare)
    r.add_get("/v1/trajectories/{id}", get_trajectory)
    r.add_post("/v1/trajectories/{id}/end", end_trajectory)
    r.add_get("/v1/engines", list_engines)
    r.add_post("/v1/engines", add_engine)
    r.add_delete("/v1/engines/{id}", remove_engine)
    r.add_patch("/v1/engines/{id}", report_engine)
    r.add_put("/v1/weights", set_weights)
    r.add_get("/v1/weights", get_weights)
    r.add_get("/workers", list_engines)
    r.add_post("/workers", add_engine)
    r.add_delete("/workers/{id:.+}", remove_engine)
    r.add_post("/add_worker", add_worker_query)  # older SGLang router API (slime's launcher)
    r.add_post("/remove_worker", remove_worker_query)
    r.add_get("/v1/loads", loads)
    r.add_get("/v1/stats", stats)
    r.add_get("/metrics", metrics)
    r.add_get("/health", health)
    return app


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    driver = request.app[DRIVER]
    try:
        resp = await handler(request)
    except BadRequest as exc:
        resp = _error(str(exc), exc.status)
    except (UnknownTrajectory, UnknownEngine) as exc:
        resp = _error(str(exc), 404)
    except Conflict as exc:
        resp = _error(str(exc), 409)
    except NoEngine as exc:
        resp = _error(str(exc), 503)
    except EngineRejected as exc:
        resp = _error(exc.detail, exc.status)
    except EngineError as exc:
        resp = _error(str(exc), 502)
    except web.HTTPRequestEntityTooLarge as exc:
        limit = driver.config.max_body_mb
        resp = _error(f"the body is larger than the router's limit of {limit} MB", 413)
        del exc
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        resp = _error(exc.reason, exc.status)
    if resp.status >= 400:
        driver.metrics.errors.labels(str(resp.status)).inc()
    return resp


async def _read(request: web.Request) -> dict[str, Any]:
    return parse_body(await request.read())


# ---- inference -----------------------------------------------------------------------------


def _inference(dialect: Dialect) -> Handler:
    route = f"/{dialect.value}"

    async def handle(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        driver = request.app[DRIVER]
        body = await _read(request)
        call = parse_call(dialect, body, None)
        key = trajectory_key(request.headers, body)
        prompt = call.prompt_ids
        if prompt is None:
            assert call.tokenize is not None
            prompt = await driver.tokenize(call.tokenize)
        _fit_context(driver, call, prompt)
        turn = driver.submit(key, prompt, call.sampling, prompt_id=call.prompt_id)
        try:
            if call.stream:
                resp = await _stream(request, call, turn, driver.model)
            else:
                await turn.finished.wait()
                if turn.error_status and turn.finish_reason == "error":
                    resp = _error(turn.error or "the turn failed", turn.error_status)
                else:
                    resp = _json(render_full(call, turn, driver.model))
        except (asyncio.CancelledError, ConnectionResetError):
            driver.abandon(turn)
            raise
        driver.metrics.requests.labels(route).observe(time.perf_counter() - started)
        return resp

    return handle


def _fit_context(driver: RolloutDriver, call: Call, prompt: list[int]) -> None:
    limit = driver.max_model_len
    if limit is None:
        return
    room = limit - len(prompt)
    if room < 1:
        raise BadRequest(f"the prompt has {len(prompt)} tokens; the model's context is {limit}")
    if call.sampling["max_tokens"] > room:
        raise BadRequest(
            f"max_tokens {call.sampling['max_tokens']} exceeds the {room} tokens left in the "
            f"model's context of {limit} after a prompt of {len(prompt)}"
        )


async def _stream(request: web.Request, call: Call, turn: Turn, model: str) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    resp.headers["Cache-Control"] = "no-cache"
    await resp.prepare(request)
    first = True
    while True:
        item = await turn.updates.get()
        if item is None:
            break
        chunk = render_chunk(call, turn, item.tokens, item.text, model, first=first, done=False)
        first = False
        await resp.write(b"data: " + _dumps(chunk).encode() + b"\n\n")
    if turn.finish_reason == "error":
        err = error_body(turn.error or "the turn failed", turn.error_status)
        await resp.write(b"data: " + _dumps(err).encode() + b"\n\n")
    else:
        last = render_chunk(call, turn, [], "", model, first=first, done=True)
        await resp.write(b"data: " + _dumps(last).encode() + b"\n\n")
        if call.include_usage:
            usage = render_usage_chunk(call, turn, model)
            await resp.write(b"data: " + _dumps(usage).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def models(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    if not driver.model:
        raise NoEngine("no engine is registered")
    data = [{"id": driver.model, "object": "model", "owned_by": "loom", "created": 0}]
    if driver.max_model_len:
        data[0]["max_model_len"] = driver.max_model_len
    return _json({"object": "list", "data": data})


# ---- rollouts --------------------------------------------------------------------------------


async def declare(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    try:
        batch = _Batch.model_validate(await _read(request))
    except ValidationError as exc:
        raise BadRequest(f"invalid batch: {exc}") from None
    entries = []
    for d in batch.trajectories:
        if isinstance(d.prompt_id, int):
            pid = d.prompt_id
        elif d.prompt_id is not None:
            pid = stable_id(d.prompt_id)
        elif d.prompt is not None:
            pid = stable_id(d.prompt)
        else:
            raise BadRequest(f"trajectory {d.id!r} needs a prompt_id or a prompt")
        entries.append(BatchEntry(d.id, pid, d.prompt_tokens, d.group))
    plan = await driver.declare(entries)
    return _json({"declared": len(plan), "plan": plan}, 201)


def _trajectory_view(driver: RolloutDriver, key: str) -> dict[str, Any]:
    t = driver.trajectories.get(key)
    if t is None:
        raise UnknownTrajectory(key)
    host = next((e.id for e in driver.engines.values() if e.idx == t.host), None)
    return {
        "id": t.key,
        "declared": t.declared,
        "turns": t.steps_done,
        "generated": t.generated,
        "context": t.context,
        "predicted_total": t.predicted_total,
        "engine": host,
        "in_flight": t.active.phase.value if t.active is not None else None,
    }


async def get_trajectory(request: web.Request) -> web.Response:
    return _json(_trajectory_view(request.app[DRIVER], request.match_info["id"]))


async def end_trajectory(request: web.Request) -> web.Response:
    t = request.app[DRIVER].end_trajectory(request.match_info["id"])
    return _json(
        {"id": t.key, "turns": t.steps_done, "generated": t.generated, "ended": t.active is None}
    )


# ---- engines ---------------------------------------------------------------------------------


def _engine_view(driver: RolloutDriver, eid: str) -> dict[str, Any]:
    return {"id": eid, **driver.stats()["engines"][eid]}


async def list_engines(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    return _json({"engines": [_engine_view(driver, eid) for eid in driver.engines]})


async def add_engine(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    body = await _read(request)
    if request.path == "/workers":  # SGLang gateway: {"url": ..., "worker_type"?: ...}
        body = {k: v for k, v in body.items() if k in EngineConfig.model_fields}
    try:
        cfg = EngineConfig.model_validate(body)
    except ValidationError as exc:
        raise BadRequest(f"invalid engine: {exc}") from None
    try:
        e = await driver.add_engine(cfg)
    except EngineError as exc:
        raise BadRequest(f"cannot add engine {cfg.url}: {exc}", 502) from None
    return _json(_engine_view(driver, e.id), 201)


async def report_engine(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    try:
        body = _Report.model_validate(await _read(request))
    except ValidationError as exc:
        raise BadRequest(f"invalid engine report: {exc}") from None
    e = driver.report(request.match_info["id"], **body.model_dump())
    return _json(_engine_view(driver, e.id))


def _weights_view(driver: RolloutDriver) -> dict[str, Any]:
    return {
        "version": driver.version,
        "current": sorted(e.id for e in driver.engines.values() if e.version == driver.version),
        "behind": sorted(e.id for e in driver.engines.values() if e.version != driver.version),
    }


async def set_weights(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    try:
        body = _Weights.model_validate(await _read(request))
    except ValidationError as exc:
        raise BadRequest(f"invalid weights update: {exc}") from None
    driver.set_weights(body.version, body.engines)
    return _json(_weights_view(driver))


async def get_weights(request: web.Request) -> web.Response:
    return _json(_weights_view(request.app[DRIVER]))


async def remove_engine(request: web.Request) -> web.Response:
    force = request.query.get("force", "false").lower() in ("1", "true", "yes")
    return _remove(request.app[DRIVER], request.match_info["id"], force)


def _remove(driver: RolloutDriver, eid: str, force: bool) -> web.Response:
    if eid not in driver.engines:  # SGLang's gateway names workers by URL
        url = eid.rstrip("/").replace(":/", "://", 1) if "://" not in eid else eid.rstrip("/")
        eid = next((e.id for e in driver.engines.values() if e.config.url == url), eid)
    e = driver.remove_engine(eid, force=force)
    return _json({"id": e.id, "draining": True, "running": len(e.running)}, 202)


async def add_worker_query(request: web.Request) -> web.Response:
    url = request.query.get("url")
    if not url:
        raise BadRequest("add_worker needs ?url=http://host:port")
    try:
        cfg = EngineConfig(url=url)
    except ValidationError as exc:
        raise BadRequest(f"invalid engine: {exc}") from None
    try:
        e = await request.app[DRIVER].add_engine(cfg)
    except EngineError as exc:
        raise BadRequest(f"cannot add engine {url}: {exc}", 502) from None
    return _json(_engine_view(request.app[DRIVER], e.id), 201)


async def remove_worker_query(request: web.Request) -> web.Response:
    url = request.query.get("url")
    if not url:
        raise BadRequest("remove_worker needs ?url=http://host:port")
    return _remove(request.app[DRIVER], url, False)


async def loads(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    return _json(
        {
            "loads": [
                {"worker": e.config.url, "id": e.id, "load": e.load}
                for e in driver.engines.values()
            ]
        }
    )


async def stats(request: web.Request) -> web.Response:
    return _json(request.app[DRIVER].stats())


async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=request.app[DRIVER].metrics.render(),
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )


async def health(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    live = len(driver.live())
    if not live:
        return _error("no live engine", 503)
    return _json({"status": "ok", "engines": live})
