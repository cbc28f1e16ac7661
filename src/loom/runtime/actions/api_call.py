"""API actions: real outbound HTTP calls, made only when the Basic manager (§5.1) grants a
slot of the call's quota."""

from __future__ import annotations

import asyncio
import json

import httpx
from pydantic import JsonValue

from loom.core.actions import ActionStatus
from loom.runtime.actions.executor import ExecContext
from loom.runtime.actions.record import Outcome

__all__ = ["ApiExecutor"]


class ApiExecutor:
    """One shared connection pool; the response body is kept up to `max_output_bytes`."""

    def __init__(self, max_output_bytes: int, *, trust_env: bool = True) -> None:
        self.max_output_bytes = max_output_bytes
        # NOTE: no pool limit: the Basic manager's concurrency limits are the only ones.
        self._client = httpx.AsyncClient(
            trust_env=trust_env, limits=httpx.Limits(max_connections=None)
        )

    def _body(self, response: httpx.Response) -> tuple[JsonValue, bool]:
        content = response.content
        truncated = len(content) > self.max_output_bytes
        if not truncated and response.headers.get("content-type", "").startswith(
            "application/json"
        ):
            try:
                value: JsonValue = json.loads(content)
                return value, False
            except ValueError:
                pass
        return content[: self.max_output_bytes].decode(errors="replace"), truncated

    async def run(self, ctx: ExecContext) -> Outcome:
        call = ctx.request.api
        assert call is not None, "an API action has a call"
        ctx.started()
        try:
            async with asyncio.timeout(ctx.timeout_s):  # a deadline for the whole exchange
                response = await self._client.request(
                    call.method.value,
                    call.url,
                    json=call.body,
                    headers=call.headers,
                    timeout=ctx.timeout_s,
                )
        except (TimeoutError, httpx.TimeoutException):
            return Outcome(
                status=ActionStatus.TIMED_OUT, error=f"timed out after {ctx.timeout_s:g} s"
            )
        except httpx.HTTPError as exc:
            return Outcome(status=ActionStatus.FAILED, error=f"{type(exc).__name__}: {exc}")
        body, truncated = self._body(response)
        ok = response.status_code < 400
        return Outcome(
            status=ActionStatus.SUCCEEDED if ok else ActionStatus.FAILED,
            exit_code=response.status_code,
            result={"status_code": response.status_code, "body": body},
            truncated=truncated,
            error=None if ok else f"HTTP {response.status_code}",
        )

    async def close(self) -> None:
        await self._client.aclose()
