"""What the clients share: an error that carries the service's status, message and kind,
reading it from a response (either error shape the shared web layer renders), the bearer token
header, and owning an httpx client (closing it, `with`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import httpx

from loom.core.errors import ServiceError  # in the family of every error kind
from loom.runtime.web.errors import error_parts

__all__ = [
    "AsyncHttpClient",
    "HttpClient",
    "ServiceError",
    "bearer_headers",
    "checked",
]


def checked(resp: httpx.Response, error: Callable[[int, str, str | None], Exception]) -> Any:
    """The response's JSON, or `error(status, message, code)` with the message and the kind's
    code of a 4xx/5xx body (`loom.runtime.web.errors.error_parts`; the raw text and no code
    when the body is neither shape). `error` is a `ServiceError` subclass's `of` (the kind
    the service named, as well), or a function choosing one by the code."""
    if resp.status_code >= 400:
        try:
            code, message = error_parts(resp.json())
        except (ValueError, KeyError, TypeError):
            code, message = None, resp.text[:500]
        raise error(resp.status_code, message, code)
    return resp.json()


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
