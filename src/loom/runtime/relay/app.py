"""The relay's HTTP API (FastAPI) over an in-memory weight store: raw object bodies in and out,
batch pulls as one framed body (`framing`), versions and members as JSON."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

from fastapi import Body, FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import ClientDisconnect

from loom._version import __version__
from loom.core.errors import InvalidRequest, http_status
from loom.runtime.relay import framing
from loom.runtime.relay.config import RelayConfig
from loom.runtime.relay.errors import RelayError
from loom.runtime.relay.memory import InMemoryStore
from loom.runtime.relay.metrics import RelayMetrics
from loom.runtime.relay.store import MAX_VERSION, ObjectInfo, Role
from loom.runtime.service import BearerToken, BodyLimit, add_error_handlers, loom_error
from loom.runtime.web.probes import METRICS_CONTENT_TYPE, health

__all__ = ["create_app"]

MAX_BATCH_KEYS = 100_000

_DESCRIPTION = """\
A relay of model weights between a training cluster and serving GPUs (ROSE §4.2): training
ranks PUT versioned objects (fixed-size buckets), serving ranks GET them or pull many in one
`POST /v1/objects:batch`, without coordinating with each other. Members join and leave freely;
the relay keeps every version a live member may still need and drops the older ones.
"""

Version = Annotated[int, Query(ge=0, le=MAX_VERSION, description="the objects' version")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BatchRequest(_Model):
    keys: list[str] = Field(max_length=MAX_BATCH_KEYS, description="objects to pull, in order")


class JoinRequest(_Model):
    role: Role = Role.SERVE
    version: int | None = Field(
        default=None, ge=0, le=MAX_VERSION, description="train: publishing; serve: held"
    )


def create_app(config: RelayConfig | None = None, store: InMemoryStore | None = None) -> FastAPI:
    """The app over `store` (default: a new one sized by `config`)."""
    cfg = config or RelayConfig()
    app = FastAPI(title="Loom weight relay", version=__version__, description=_DESCRIPTION)
    app.state.store = store or InMemoryStore(
        cfg.max_bytes, member_ttl_s=cfg.member_ttl_s, auto_collect=cfg.auto_collect
    )
    app.state.metrics = RelayMetrics()
    _add_error_handlers(app)
    _add_object_routes(app)
    _add_version_routes(app)
    _add_member_routes(app)
    app.add_middleware(BodyLimit, max_bytes=cfg.max_object_bytes, hint="--max-object-bytes")
    if cfg.token is not None:
        app.add_middleware(BearerToken, token=cfg.token, open_health=cfg.open_health)
    return app


def _store(request: Request) -> InMemoryStore:
    store: InMemoryStore = request.app.state.store
    return store


def _metrics(request: Request) -> RelayMetrics:
    metrics: RelayMetrics = request.app.state.metrics
    return metrics


def _add_error_handlers(app: FastAPI) -> None:
    async def refused(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RelayError)
        _metrics(request).refused.labels(exc.CODE).inc()
        return await loom_error(request, exc)

    add_error_handlers(app)
    app.add_exception_handler(RelayError, refused)


async def _body(request: Request) -> bytes | None:
    """The whole request body, or None if the client went (or `BodyLimit` answered 413)."""
    chunks = []
    try:
        async for chunk in request.stream():
            chunks.append(chunk)
    except ClientDisconnect:
        return None
    return b"".join(chunks)


def _add_object_routes(app: FastAPI) -> None:
    @app.get("/healthz", tags=["server"])
    async def healthz() -> dict[str, str]:
        return health()

    @app.get("/metrics", tags=["server"], response_class=Response)
    async def metrics(request: Request) -> Response:
        """Prometheus: bytes and objects stored, capacity, bytes put and read, refusals."""
        text = _metrics(request).render(_store(request).stats())
        return Response(text, media_type=METRICS_CONTENT_TYPE)

    @app.get("/v1/stats", tags=["server"])
    async def stats(request: Request) -> dict[str, int]:
        s = _store(request).stats()
        return {
            "bytes": s.bytes,
            "max_bytes": s.max_bytes,
            "objects": s.objects,
            "versions": s.versions,
            "members": s.members,
            "dropped_versions": s.dropped,
        }

    @app.put("/v1/objects/{key:path}", tags=["objects"])
    async def put_object(key: str, version: Version, request: Request) -> Any:
        """Store the raw body under `key` at `version`: whole, or not at all (507 when the
        cap would be passed, 409 when the key holds another version, 413 when too large).
        Putting the same key and version again replaces the bytes."""
        store = _store(request)
        declared = request.headers.get("content-length", "")
        # refuse before reading what could not be stored
        store.admit(key, version, int(declared) if declared.isdigit() else 0)
        data = await _body(request)
        if data is None:
            # nobody reads it: the client went, or got a 413
            return Response(status_code=http_status(InvalidRequest()))
        info = store.put(key, data, version)
        m = _metrics(request)
        m.puts.inc()
        m.put_bytes.inc(info.size)
        return info.to_json()

    @app.get("/v1/objects/{key:path}", tags=["objects"], response_class=Response)
    async def get_object(key: str, request: Request) -> Response:
        """The object's raw bytes; its version in the `X-Loom-Version` header."""
        data, version = _store(request).get_with_version(key)
        _metrics(request).read(1, len(data))
        return Response(
            data,
            media_type="application/octet-stream",
            headers={framing.VERSION_HEADER: str(version)},
        )

    @app.delete("/v1/objects/{key:path}", tags=["objects"])
    async def delete_object(key: str, request: Request) -> dict[str, Any]:
        return _store(request).delete(key).to_json()

    @app.get("/v1/objects", tags=["objects"])
    async def list_objects(
        request: Request,
        version: Annotated[int | None, Query(ge=0, le=MAX_VERSION)] = None,
        prefix: Annotated[str, Query(max_length=512)] = "",
    ) -> dict[str, Any]:
        """Objects by key, of one version and under a key prefix if given."""
        infos = _store(request).list(version=version, prefix=prefix)
        return {
            "objects": [i.to_json() for i in infos],
            "count": len(infos),
            "bytes": sum(i.size for i in infos),
        }

    @app.post("/v1/objects:batch", tags=["objects"], response_class=Response)
    async def batch(body: BatchRequest, request: Request) -> Response:
        """Many objects in one body (see `loom.runtime.relay.framing`): all or none (404
        naming the missing keys)."""
        found = _store(request).get_many_with_versions(body.keys)
        objects = [
            (ObjectInfo(key=k, version=v, size=len(data)), data) for k, (data, v) in found.items()
        ]
        length, pieces = framing.frames(objects)
        m = _metrics(request)
        m.batches.inc()
        m.read(len(objects), length)
        return StreamingResponse(
            _aiter(pieces),
            media_type=framing.MEDIA_TYPE,
            headers={"Content-Length": str(length)},
        )


async def _aiter(pieces: Iterator[bytes]) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


def _add_version_routes(app: FastAPI) -> None:
    @app.get("/v1/versions", tags=["versions"])
    async def versions(request: Request) -> dict[str, Any]:
        """Versions stored, oldest first; `needed`: some live member may still need it."""
        return {"versions": [v.to_json() for v in _store(request).versions()]}

    @app.delete("/v1/versions/{version}", tags=["versions"])
    async def drop_version(
        version: Annotated[int, Path(ge=0, le=MAX_VERSION)], request: Request
    ) -> dict[str, Any]:
        """Delete every object of a version no live member needs (409 if one may)."""
        return _store(request).drop_version(version).to_json()

    @app.post("/v1/versions:collect", tags=["versions"])
    async def collect(request: Request) -> dict[str, list[int]]:
        """Drop every version no live member may need."""
        return {"dropped": _store(request).collect()}


def _add_member_routes(app: FastAPI) -> None:
    @app.post("/v1/members/{member_id}", tags=["members"])
    async def join(
        member_id: str, request: Request, body: Annotated[JoinRequest | None, Body()] = None
    ) -> dict[str, Any]:
        """Join (or update, or heartbeat): a role and the version published or held."""
        spec = body or JoinRequest()
        return _store(request).join(member_id, spec.role, spec.version).to_json()

    @app.delete("/v1/members/{member_id}", tags=["members"])
    async def leave(member_id: str, request: Request) -> dict[str, Any]:
        return _store(request).leave(member_id).to_json()

    @app.get("/v1/members", tags=["members"])
    async def members(request: Request) -> dict[str, Any]:
        return {"members": [m.to_json() for m in _store(request).members()]}
