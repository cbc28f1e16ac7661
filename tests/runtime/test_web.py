"""The shared web layer (`loom.runtime.web`): the same bad token, bad JSON, oversized body and
Loom error kind answer with the same status and body on a FastAPI service and on an aiohttp
service (real servers on 127.0.0.1), and a client reads either shape into the kind."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web
from fastapi import FastAPI
from pydantic import BaseModel

from loom.client.actions import ActionError
from loom.client.rollout import RolloutError
from loom.core.errors import Conflict, InvalidRequest, LoomError, NotFound, ServiceError
from loom.runtime.service import (
    BackgroundApp,
    BackgroundService,
    BearerToken,
    BodyLimit,
    add_error_handlers,
)
from loom.runtime.web import probes
from loom.runtime.web.aio import auth_middleware, error_middleware, json_object, json_response
from loom.runtime.web.errors import ErrorShape, error_parts, render

TOKEN = "a-token-of-sixteen-or-more"
LIMIT = 1000
HINT = "--max-body-bytes"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Echo(BaseModel):
    x: int


def _fastapi() -> FastAPI:
    app = FastAPI()
    add_error_handlers(app)

    @app.post("/v1/echo")
    async def echo(body: Echo) -> dict[str, Any]:
        return {"echo": body.x}

    @app.get("/v1/missing")
    async def missing() -> None:
        raise NotFound("no such thing")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return probes.health()

    app.add_middleware(BodyLimit, max_bytes=LIMIT, hint=HINT)
    app.add_middleware(BearerToken, token=TOKEN)
    return app


def _aiohttp(shape: ErrorShape) -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        body = json_object(await request.read())
        return json_response({"echo": body["x"]})

    async def missing(request: web.Request) -> web.Response:
        raise NotFound("no such thing")

    async def health(request: web.Request) -> web.Response:
        return json_response(probes.health())

    middlewares = [
        error_middleware(shape, max_bytes=LIMIT, hint=HINT),
        auth_middleware(TOKEN, open_health=True),
    ]
    app = web.Application(client_max_size=LIMIT, middlewares=middlewares)
    app.router.add_post("/v1/echo", echo)
    app.router.add_get("/v1/missing", missing)
    app.router.add_get("/health", health)
    return app


class _BackgroundAiohttp(BackgroundService):
    def __init__(self, app: web.Application) -> None:
        super().__init__("127.0.0.1", 0, name="aiohttp test service")
        self.app = app
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    def _serve(self) -> None:
        async def run() -> None:
            self._stop = asyncio.Event()
            runner = web.AppRunner(self.app, access_log=None)
            await runner.setup()
            await web.SockSite(runner, self._sock).start()
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(run())
        finally:
            self._loop.close()

    def _started(self) -> bool:
        return self._ready.is_set()

    def _request_stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    with (
        BackgroundApp(_fastapi(), "127.0.0.1", 0, name="fastapi test service") as api,
        _BackgroundAiohttp(_aiohttp(ErrorShape.LOOM)) as aio,
        _BackgroundAiohttp(_aiohttp(ErrorShape.OPENAI)) as openai,
    ):
        yield {"fastapi": api.url, "aiohttp": aio.url, "openai": openai.url}


def _both(servers: dict[str, str], method: str, path: str, **kw: Any) -> list[httpx.Response]:
    return [httpx.request(method, servers[s] + path, **kw) for s in ("fastapi", "aiohttp")]


def test_a_bad_token_is_the_same_401_on_both_stacks(servers: dict[str, str]) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong-token-of-length"}):
        api, aio = _both(servers, "POST", "/v1/echo", json={"x": 1}, headers=headers)
        assert api.status_code == aio.status_code == 401
        assert api.json() == aio.json() and api.json()["error"] == "unauthorized"
        assert api.headers["WWW-Authenticate"] == aio.headers["WWW-Authenticate"] == "Bearer"


def test_health_is_open_and_the_same_body(servers: dict[str, str]) -> None:
    api, aio = _both(servers, "GET", "/health")
    assert api.status_code == aio.status_code == 200
    assert api.json() == aio.json() == {"status": "ok"}


def test_an_oversized_body_is_the_same_413(servers: dict[str, str]) -> None:
    big = b'{"x": 1, "pad": "' + b"a" * (2 * LIMIT) + b'"}'
    api, aio = _both(
        servers,
        "POST",
        "/v1/echo",
        content=big,
        headers={**AUTH, "content-type": "application/json"},
    )
    assert api.status_code == aio.status_code == 413
    assert api.json() == aio.json()
    assert api.json()["error"] == "too_large" and str(LIMIT) in api.json()["detail"]


def test_malformed_json_is_the_same_400_kind(servers: dict[str, str]) -> None:
    bad = {"content": b"{not json", "headers": {**AUTH, "content-type": "application/json"}}
    api, aio = _both(servers, "POST", "/v1/echo", **bad)
    assert api.status_code == aio.status_code == 400
    assert api.json()["error"] == aio.json()["error"] == "invalid"
    assert set(api.json()) == set(aio.json()) == {"error", "detail"}
    assert "JSON" in api.json()["detail"] and "JSON" in aio.json()["detail"]


def test_a_loom_error_kind_is_the_same_status_and_body(servers: dict[str, str]) -> None:
    api, aio = _both(servers, "GET", "/v1/missing", headers=AUTH)
    assert api.status_code == aio.status_code == 404
    assert api.json() == aio.json() == {"error": "not_found", "detail": "no such thing"}


def test_the_openai_shape_is_the_same_error_rendered_for_openai_clients(
    servers: dict[str, str],
) -> None:
    loom = httpx.get(servers["aiohttp"] + "/v1/missing", headers=AUTH)
    openai = httpx.get(servers["openai"] + "/v1/missing", headers=AUTH)
    assert openai.status_code == loom.status_code == 404
    err = openai.json()["error"]
    assert err == {
        "message": "no such thing",
        "type": "invalid_request_error",
        "param": None,
        "code": 404,
        "kind": "not_found",
    }
    assert error_parts(openai.json()) == error_parts(loom.json()) == ("not_found", "no such thing")
    refused = httpx.get(servers["openai"] + "/v1/missing")
    assert refused.status_code == 401 and refused.json()["error"]["kind"] == "unauthorized"


@pytest.mark.parametrize("shape", list(ErrorShape))
def test_render_maps_every_kind_through_http_status(shape: ErrorShape) -> None:
    for exc, status in ((InvalidRequest("x"), 400), (Conflict("x"), 409), (LoomError("x"), 500)):
        out = render(exc, shape)
        assert out.status == status
        assert error_parts(out.body) == (exc.code, "x")


def test_a_client_error_is_the_kind_the_service_named() -> None:
    err = ActionError.of(404, "no action 'a'", "not_found")
    assert isinstance(err, ActionError) and isinstance(err, NotFound)
    assert isinstance(err, ServiceError) and isinstance(err, LoomError)
    assert err.status == 404 and err.message == "no action 'a'" and err.code == "not_found"
    assert type(ActionError.of(409, "x", "conflict")) is type(ActionError.of(409, "y", "conflict"))
    plain = RolloutError.of(418, "teapot", "no_such_code")
    assert type(plain) is RolloutError and not isinstance(plain, NotFound)
    with pytest.raises(Conflict):
        raise RolloutError.of(409, "x", "conflict")
