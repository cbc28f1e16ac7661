"""The rollout router's HTTP API (aiohttp: a lean request path, see DESIGN's router targets).

Inference, in the dialects clients already speak: `POST /v1/completions`,
`POST /v1/chat/completions`, `GET /v1/models` (OpenAI, vLLM's fields) and `POST /generate`
(SGLang's native token-in/token-out); `POST /abort_request` (SGLang: `rid` or `abort_all`)
and `POST /abort_requests` (vLLM: `request_ids`) end requests with what they generated.
Rollout control: `POST /v1/rollouts` declares a batch, `POST /v1/trajectories/{id}/end`
ends one, `GET /v1/trajectories/{id}` reads one. Engines: `GET/POST /v1/engines`,
`DELETE /v1/engines/{id}`, `PATCH /v1/engines/{id}` (what an engine's side reports: its
weight version; a lent engine's room and serving slack), `PUT /v1/weights` (the current
weight version), and the same registry shaped like SGLang's model gateway (`GET/POST
/workers`, `GET/PUT/DELETE /workers/{id}`, `GET /v1/loads`, and the older `/add_worker`,
`/remove_worker`, `/list_workers`) so that launchers and slime's abort loop work unchanged:
each engine under its own url, and first the router itself (`ROUTER_WORKER`), so that a
client that aborts every listed url and polls its `/v1/loads` also reaches the turns that
wait here. Observability: `GET /v1/stats`, `GET /metrics`, `GET /health`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loom.core.errors import NotFound, Unavailable
from loom.runtime.rollout.config import EngineConfig, RolloutServerConfig
from loom.runtime.rollout.driver import BatchEntry, RolloutDriver, UnknownTrajectory, stable_id
from loom.runtime.rollout.engines import Delta, EngineError
from loom.runtime.rollout.fleet import PlannedFleet
from loom.runtime.rollout.protocol import (
    BadRequest,
    Dialect,
    Renderer,
    error_body,
    finish_call,
    parse_body,
    parse_call,
    render_full,
    trajectory_key,
)
from loom.runtime.rollout.state import EngineState, Turn
from loom.runtime.rollout.turn import TurnState
from loom.runtime.web import probes
from loom.runtime.web.aio import (
    Handler,
    auth_middleware,
    error_middleware,
    json_response,
    metrics_response,
)
from loom.runtime.web.errors import ErrorShape

__all__ = ["DRIVER", "ROUTER_WORKER", "create_app"]

DRIVER = web.AppKey("driver", RolloutDriver)
# the id of the router's own `GET /workers` entry (an engine id cannot start with "_")
ROUTER_WORKER = "_router"
_dumps = orjson.dumps


_json = json_response


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


class _Plan(BaseModel):
    model_config = ConfigDict(extra="forbid")
    layout: tuple[int, ...] | None = Field(default=None, min_length=1)


class _Weights(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=0)
    engines: list[str] = Field(default_factory=list, max_length=100_000)


class _Batch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    trajectories: list[_Declared] = Field(min_length=1, max_length=100_000)


class _Worker(BaseModel):
    """SGLang's model gateway's `POST /workers` body (WorkerConfigRequest)."""

    model_config = ConfigDict(extra="forbid")
    url: str
    worker_type: str = "regular"
    bootstrap_port: int | None = None
    model_id: str | None = None
    api_key: str | None = None
    priority: int | None = None
    cost: float | None = None
    runtime: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class _WorkerUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labels: dict[str, str] | None = None
    priority: int | None = None
    cost: float | None = None


class _Abort(BaseModel):
    """SGLang's `POST /abort_request` body."""

    model_config = ConfigDict(extra="allow")
    rid: str | list[str] | None = None
    abort_all: bool = False


def create_app(config: RolloutServerConfig, driver: RolloutDriver | None = None) -> web.Application:
    driver = driver or RolloutDriver(config)
    max_bytes = int(config.max_body_mb * 2**20)
    middlewares = [
        error_middleware(
            ErrorShape.OPENAI,
            max_bytes=max_bytes,
            hint="max_body_mb",
            on_error=lambda status: driver.metrics.errors.labels(str(status)).inc(),
        )
    ]
    if config.token is not None:
        middlewares.append(auth_middleware(config.token, config.open_health))
    app = web.Application(client_max_size=max_bytes, middlewares=middlewares)
    app[DRIVER] = driver

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
    r.add_post("/abort_request", abort_request)
    r.add_post("/abort_requests", abort_requests)
    r.add_get("/v1/models", models)
    r.add_get("/get_model_info", model_info)
    r.add_post("/v1/rollouts", declare)
    r.add_get("/v1/trajectories/{id}", get_trajectory)
    r.add_post("/v1/trajectories/{id}/end", end_trajectory)
    r.add_get("/v1/engines", list_engines)
    r.add_get("/v1/fleet", fleet)
    r.add_post("/v1/fleet/plan", plan_fleet)
    r.add_post("/v1/engines", add_engine)
    r.add_delete("/v1/engines/{id}", remove_engine)
    r.add_patch("/v1/engines/{id}", report_engine)
    r.add_put("/v1/weights", set_weights)
    r.add_get("/v1/weights", get_weights)
    r.add_get("/workers", list_workers)
    r.add_post("/workers", add_worker)
    r.add_get("/workers/{id:.+}", get_worker)
    r.add_put("/workers/{id:.+}", update_worker)
    r.add_delete("/workers/{id:.+}", delete_worker)
    r.add_post("/add_worker", add_worker_query)  # sglang-router <= 0.2 (older slime)
    r.add_post("/remove_worker", remove_worker_query)
    r.add_get("/list_workers", list_worker_urls)
    r.add_get("/v1/loads", loads)
    r.add_get("/get_loads", loads)
    r.add_get("/v1/stats", stats)
    r.add_get("/metrics", metrics)
    r.add_get("/health", health)
    r.add_get("/health_generate", health)
    return app


async def _read(request: web.Request) -> dict[str, Any]:
    return parse_body(await request.read())


# ---- inference -----------------------------------------------------------------------------


def _inference(dialect: Dialect) -> Handler:
    route = f"/{dialect.value}"

    async def handle(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        driver = request.app[DRIVER]
        body = await _read(request)
        call = parse_call(dialect, body, request.headers, driver.registry.kinds(), driver.model)
        if call.text_in_logprobs and driver.tokenizer is None:
            raise BadRequest(
                "return_text_in_logprobs needs the router's tokenizer (set `tokenizer`)"
            )
        key = trajectory_key(request.headers, body)
        prompt = call.prompt_ids
        if prompt is None:
            assert call.tokenize is not None
            prompt = await driver.tokenize(call.tokenize)
        prompt = finish_call(call, prompt, driver.max_model_len)
        turns = driver.submit(key, prompt, call.request, n=call.n, prompt_id=call.prompt_id)
        renderer = Renderer(call, driver.model, _texts(driver))
        try:
            if call.stream:
                resp = await _stream(request, renderer, turns, driver)
            else:
                for turn in turns:
                    await turn.finished.wait()
                failed = next((t for t in turns if t.state is TurnState.FAILED), None)
                if failed is not None:
                    resp = _error(failed.error or "the turn failed", failed.error_status)
                else:
                    resp = _json(render_full(renderer, turns, driver.version))
        except (asyncio.CancelledError, ConnectionResetError):
            driver.abandon(turns)
            raise
        driver.metrics.route(route).observe(time.perf_counter() - started)
        return resp

    return handle


def _texts(driver: RolloutDriver) -> Callable[[Sequence[int]], list[str]] | None:
    tok = driver.tokenizer
    return tok.token_texts if tok is not None else None


async def _updates(turns: Sequence[Turn]) -> AsyncIterator[tuple[Turn, Delta | None]]:
    """Each turn's updates as they come, `(turn, None)` once a turn has ended."""
    if len(turns) == 1:
        turn = turns[0]
        assert turn.updates is not None, "a streamed turn has a feed"
        while (item := await turn.updates.get()) is not None:
            yield turn, item
        yield turn, None
        return
    merged: asyncio.Queue[tuple[Turn, Delta | None]] = asyncio.Queue()

    async def forward(turn: Turn) -> None:
        assert turn.updates is not None, "a streamed turn has a feed"
        while True:
            item = await turn.updates.get()
            merged.put_nowait((turn, item))
            if item is None:
                return

    tasks = [asyncio.get_running_loop().create_task(forward(t)) for t in turns]
    try:
        for _ in range(len(turns)):
            while True:
                pair = await merged.get()
                yield pair
                if pair[1] is None:
                    break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _stream(
    request: web.Request, renderer: Renderer, turns: Sequence[Turn], driver: RolloutDriver
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    resp.headers["Cache-Control"] = "no-cache"
    await resp.prepare(request)
    call = renderer.call
    sent = {t.seq: 0 for t in turns}  # tokens streamed so far, per turn
    first = {t.seq: True for t in turns}

    async def send(obj: Any) -> None:
        await resp.write(b"data: " + _dumps(obj) + b"\n\n")

    if call.dialect is Dialect.CHAT:
        for turn in turns:
            await send(renderer.chat_role_chunk(turn))
    failed: Turn | None = None
    async for turn, item in _updates(turns):
        start = sent[turn.seq]
        end = len(turn.generated)
        if item is not None:
            if call.dialect is Dialect.GENERATE:
                await send(renderer.sglang(turn, done=False, version=driver.version))
            else:
                await send(
                    renderer.openai_chunk(
                        turn, start, end, item.text, first=first[turn.seq], done=False
                    )
                )
            sent[turn.seq] = end
            first[turn.seq] = False
            continue
        if turn.state is TurnState.FAILED:
            failed = failed or turn
        elif call.dialect is Dialect.GENERATE:
            await send(renderer.sglang(turn, done=True, version=driver.version))
        else:
            await send(
                renderer.openai_chunk(turn, start, end, "", first=first[turn.seq], done=True)
            )
    if failed is not None:
        await send(error_body(failed.error or "the turn failed", failed.error_status))
    elif call.include_usage and call.dialect is not Dialect.GENERATE:
        await send(renderer.usage_chunk(turns))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def models(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    if not driver.model:
        raise Unavailable("no engine is registered")
    data = [{"id": driver.model, "object": "model", "owned_by": "loom", "created": 0}]
    if driver.max_model_len:
        data[0]["max_model_len"] = driver.max_model_len
    return _json({"object": "list", "data": data})


async def model_info(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    return _json(
        {
            "model_path": driver.model,
            "is_generation": True,
            "tokenizer_path": driver.tokenizer.source if driver.tokenizer else None,
        }
    )


async def abort_request(request: web.Request) -> web.Response:
    """SGLang's abort: `{"rid": ...}` or `{"abort_all": true}`. Each aborted request answers
    with what it generated, finish reason abort."""
    try:
        body = _Abort.model_validate(await _read(request))
    except ValidationError as exc:
        raise BadRequest(f"invalid abort: {exc}") from None
    driver = request.app[DRIVER]
    rids = [body.rid] if isinstance(body.rid, str) else list(body.rid or ())
    if not body.abort_all and not rids:
        raise BadRequest("abort_request needs a rid or abort_all: true")
    n = driver.abort(rids, everything=body.abort_all)
    return _json({"aborted": n})


async def abort_requests(request: web.Request) -> web.Response:
    """vLLM's dev-mode abort: `{"request_ids": [...]}` (its `cmpl-{id}-0` names or the ids the
    clients gave); an empty or missing list aborts every request."""
    body = await _read(request)
    ids = body.get("request_ids")
    if ids is not None and not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
        raise BadRequest("request_ids must be a list of strings")
    driver = request.app[DRIVER]
    if not ids:
        n = driver.abort(everything=True)
    else:
        rids = set(ids)
        for rid in ids:  # vLLM's own request names: cmpl-{id}-0, chatcmpl-{id}
            for prefix in ("cmpl-", "chatcmpl-"):
                if rid.startswith(prefix):
                    rest = rid[len(prefix) :]
                    rids.add(rest[:-2] if rest.endswith("-0") else rest)
        n = driver.abort(sorted(rids))
    return _json({"status": "aborted", "aborted": n})


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
    states = sorted({turn.state.name.lower() for turn in t.active.values()})
    return {
        "id": t.key,
        "declared": t.declared,
        "turns": t.steps_done,
        "generated": t.generated,
        "context": t.context,
        "predicted_total": t.predicted_total,
        "engine": host,
        "in_flight": len(t.active),
        "states": states,
    }


async def get_trajectory(request: web.Request) -> web.Response:
    return _json(_trajectory_view(request.app[DRIVER], request.match_info["id"]))


async def end_trajectory(request: web.Request) -> web.Response:
    t = request.app[DRIVER].end_trajectory(request.match_info["id"])
    return _json(
        {"id": t.key, "turns": t.steps_done, "generated": t.generated, "ended": not t.active}
    )


# ---- engines ---------------------------------------------------------------------------------


def _engine_view(driver: RolloutDriver, e: EngineState) -> dict[str, Any]:
    return {"id": e.id, **driver.engine_view(e)}


async def list_engines(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    return _json({"engines": [_engine_view(driver, e) for e in driver.engines.values()]})


def _fleet(driver: RolloutDriver) -> PlannedFleet:
    if driver.fleet is None:
        raise NotFound("this router starts no engines of its own (no `fleet` in its config)")
    return driver.fleet


async def fleet(request: web.Request) -> web.Response:
    return _json(_fleet(request.app[DRIVER]).view())


async def plan_fleet(request: web.Request) -> web.Response:
    """Plan the layout again from the history (or take the body's `layout`) and move the
    fleet to it; answers once the new engines serve."""
    fleet = _fleet(request.app[DRIVER])
    raw = await request.read()
    try:
        body = _Plan.model_validate(parse_body(raw) if raw.strip() else {})
    except ValidationError as exc:
        raise BadRequest(f"invalid plan: {exc}") from None
    return _json(await fleet.plan(body.layout))


async def _add(driver: RolloutDriver, cfg: EngineConfig) -> EngineState:
    try:
        return await driver.add_engine(cfg)
    except EngineError as exc:
        raise EngineError(f"cannot add engine {cfg.url}: {exc}") from None


async def add_engine(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    try:
        cfg = EngineConfig.model_validate(await _read(request))
    except ValidationError as exc:
        raise BadRequest(f"invalid engine: {exc}") from None
    e = await _add(driver, cfg)
    return _json(_engine_view(driver, e), 201)


async def report_engine(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    try:
        body = _Report.model_validate(await _read(request))
    except ValidationError as exc:
        raise BadRequest(f"invalid engine report: {exc}") from None
    e = driver.report(request.match_info["id"], **body.model_dump())
    return _json(_engine_view(driver, e))


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
    driver = request.app[DRIVER]
    e = driver.remove_engine(request.match_info["id"], force=force)
    return _json({"id": e.id, "draining": True, "running": len(e.running)}, 202)


# ---- SGLang's model gateway ----------------------------------------------------------------


def _router_url(request: web.Request) -> str:
    """This router's url as the client reached it."""
    return f"{request.scheme}://{request.host}"


def _worker_info(driver: RolloutDriver, e: EngineState) -> dict[str, Any]:
    return {
        "id": e.id,
        "url": e.config.url,
        "engine_url": e.config.url,
        "model_id": e.model,
        "worker_type": "regular",
        "connection_mode": "Http",
        "runtime_type": e.config.kind.value,
        "is_healthy": e.alive,
        "load": e.load,
        "labels": dict(e.labels),
        "draining": e.draining,
        "version": e.version,
    }


def _router_info(request: web.Request, driver: RolloutDriver) -> dict[str, Any]:
    """The router's own entry: it answers SGLang's `/generate`, `/abort_request` and
    `/v1/loads` for every turn, those waiting here included (its load)."""
    return {
        "id": ROUTER_WORKER,
        "url": _router_url(request),
        "engine_url": None,
        "model_id": driver.model,
        "worker_type": "regular",
        "connection_mode": "Http",
        "runtime_type": "router",
        "is_healthy": bool(driver.live()),
        "load": driver.held() + sum(len(e.waiting) for e in driver.engines.values()),
        "labels": {},
        "draining": False,
        "version": driver.version,
    }


def _worker(request: web.Request) -> EngineState | None:
    """The engine `/workers/{id}` names (an id or the url it registered with); None: the
    router's own entry."""
    key = request.match_info["id"]
    if key == ROUTER_WORKER:
        return None
    return request.app[DRIVER].core.fleet.get(key)


def _not_an_engine(what: str) -> BadRequest:
    return BadRequest(f"{ROUTER_WORKER} is this router, not an engine: it cannot be {what}")


async def list_workers(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    workers = [_router_info(request, driver)]
    workers += [_worker_info(driver, e) for e in driver.engines.values()]
    return _json(
        {
            "workers": workers,
            "total": len(workers),
            "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": len(workers)},
        }
    )


async def add_worker(request: web.Request) -> web.Response:
    """`POST /workers {url, worker_type, bootstrap_port, ...}`: a regular worker is
    registered (again: an engine that came back at a known url is taken as it is)."""
    driver = request.app[DRIVER]
    try:
        body = _Worker.model_validate(await _read(request))
    except ValidationError as exc:
        raise BadRequest(f"invalid worker: {exc}") from None
    if body.worker_type != "regular":
        raise BadRequest(
            f"worker_type {body.worker_type!r} is not supported: Loom's router does not "
            "disaggregate prefill and decode (register regular workers)"
        )
    for name in ("priority", "cost", "api_key"):
        if getattr(body, name) is not None:
            raise BadRequest(
                f"{name} is not supported: Loom's placement does not weight "
                "workers, and engines are reached without keys"
            )
    try:
        cfg = EngineConfig(url=body.url)
    except ValidationError as exc:
        raise BadRequest(f"invalid worker url: {exc}") from None
    e = await _register(driver, cfg)
    e.labels.update(body.labels)
    return _json(
        {
            "status": "accepted",
            "worker_id": e.id,
            "message": "worker registered",
            **_worker_info(driver, e),
        },
        202,
    )


async def _register(driver: RolloutDriver, cfg: EngineConfig) -> EngineState:
    """An engine at a new url is probed and added; one at a known url is taken as it is
    (again: a launcher that restarted a deregistered engine there gets it back)."""
    e = driver.core.fleet.by_url(cfg.url)
    if e is None:
        return await _add(driver, cfg)
    driver.take_back(e)
    return e


async def get_worker(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    e = _worker(request)
    return _json(_router_info(request, driver) if e is None else _worker_info(driver, e))


async def update_worker(request: web.Request) -> web.Response:
    e = _worker(request)
    if e is None:
        raise _not_an_engine("updated")
    try:
        body = _WorkerUpdate.model_validate(await _read(request))
    except ValidationError as exc:
        raise BadRequest(f"invalid worker update: {exc}") from None
    for name in ("priority", "cost"):
        if getattr(body, name) is not None:
            raise BadRequest(f"{name} is not supported: Loom's placement does not weight workers")
    e.labels.update(body.labels or {})
    return _json({"status": "accepted", "worker_id": e.id, "message": "worker updated"}, 202)


async def delete_worker(request: web.Request) -> web.Response:
    """The gateway's deregistration (slime's engine shutdown: `DELETE /workers/{id}`, then
    it stops the engine): the engine drains, is let go even if it is the last, and is
    removed once its turns have finished there or, if it goes first, resumed elsewhere."""
    driver = request.app[DRIVER]
    e = _worker(request)
    if e is None:
        raise _not_an_engine("removed")
    force = request.query.get("force", "false").lower() in ("1", "true", "yes")
    driver.remove_engine(e.id, force=force, leaving=True)
    return _json(
        {
            "status": "accepted",
            "worker_id": e.id,
            "message": "worker draining: removed once its turns end",
        },
        202,
    )


async def add_worker_query(request: web.Request) -> web.Response:
    url = request.query.get("url")
    if not url:
        raise BadRequest("add_worker needs ?url=http://host:port")
    try:
        cfg = EngineConfig(url=url)
    except ValidationError as exc:
        raise BadRequest(f"invalid engine: {exc}") from None
    await _register(request.app[DRIVER], cfg)
    return web.Response(text=f"Successfully added worker: {cfg.url}")


async def remove_worker_query(request: web.Request) -> web.Response:
    url = request.query.get("url")
    if not url:
        raise BadRequest("remove_worker needs ?url=http://host:port")
    driver = request.app[DRIVER]
    e = driver.core.fleet.by_url(url)
    if e is None:
        raise NotFound(f"no worker at {url}")
    driver.remove_engine(e.id, leaving=True)
    return web.Response(text=f"Successfully removed worker: {e.config.url}")


async def list_worker_urls(request: web.Request) -> web.Response:
    """sglang-router 0.2's list (older slime aborts each url): the router's, then the
    engines'."""
    driver = request.app[DRIVER]
    return _json({"urls": [_router_url(request), *(e.config.url for e in driver.engines.values())]})


async def loads(request: web.Request) -> web.Response:
    """The gateway's `{"workers": [{"worker", "load"}]}` beside SGLang's `{"loads": [...]}`
    (what slime's abort loop sums until it reads zero): one entry per engine and one for the
    turns held in the router."""
    driver = request.app[DRIVER]
    per = [
        {
            "worker": e.config.url,
            "id": e.id,
            "dp_rank": 0,
            "num_running_reqs": len(e.running),
            "num_waiting_reqs": len(e.waiting),
            "num_total_reqs": e.load,
        }
        for e in driver.engines.values()
    ]
    held = driver.held()
    per.append(
        {
            "worker": "router",
            "id": "held",
            "dp_rank": 0,
            "num_running_reqs": 0,
            "num_waiting_reqs": held,
            "num_total_reqs": held,
        }
    )
    return _json(
        {
            "workers": [{"worker": e.config.url, "load": e.load} for e in driver.engines.values()],
            "loads": per,
            "aggregate": {"num_total_reqs": driver.load()},
        }
    )


async def stats(request: web.Request) -> web.Response:
    return _json(request.app[DRIVER].stats())


async def metrics(request: web.Request) -> web.Response:
    return metrics_response(request.app[DRIVER].metrics.registry)


async def health(request: web.Request) -> web.Response:
    live = len(request.app[DRIVER].live())
    return _json(probes.health(None if live else "no live engine", engines=live))
