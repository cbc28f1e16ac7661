"""What the clients share: an error that carries the service's status and message, reading it
from a response, the bearer token header, and owning an httpx client (closing it, `with`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import httpx

from loom.core.errors import ServiceError  # defined there so services can raise it too

__all__ = [
    "AsyncHttpClient",
    "HttpClient",
    "ServiceError",
    "bearer_headers",
    "checked",
    "fastapi_detail",
]


def checked(
    resp: httpx.Response,
    error: Callable[[int, str], Exception],
    message_of: Callable[[Any], str],
) -> Any:
    """The response's JSON, or `error(status, message)` with the message `message_of(body)`
    finds in a 4xx/5xx body (the raw text when the body is not what it expects). `error` is
    a `ServiceError` subclass, or a function choosing one (by the body, say)."""
    if resp.status_code >= 400:
        try:
            message = message_of(resp.json())
        except (ValueError, KeyError, TypeError):
            message = resp.text[:500]
        raise error(resp.status_code, message)
    return resp.json()


def fastapi_detail(body: Any) -> str:
    """The message of a FastAPI error body: its `detail`, or where and what for each
    validation error."""
    detail = body["detail"]
    if isinstance(detail, list):  # validation errors: where and what
        return "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail)
    return str(detail)


def bearer_headers(token: str | None) -> dict[str, str]:
    """The Authorization header for `token` (None: `LOOM_TOKEN` if set; no header without)."""
    token = token if token is not None else os.environ.get("LOOM_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


class HttpClient:
    """Owns `self.http`, a synchronous httpx client of `base_url` with the bearer token."""

    def __init__(
        self, base_url: str, *, token: str | None, timeout_s: float, **httpx_options: Any
    ) -> None:
        self.http = httpx.Client(
            base_url=base_url, timeout=timeout_s, headers=bearer_headers(token), **httpx_options
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncHttpClient:
    """Owns `self.http`, an httpx.AsyncClient of `base_url` with the bearer token."""

    def __init__(
        self, base_url: str, *, token: str | None, timeout_s: float, **httpx_options: Any
    ) -> None:
        self.http = httpx.AsyncClient(
            base_url=base_url, timeout=timeout_s, headers=bearer_headers(token), **httpx_options
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
