"""Clients of the action server (`loom serve actions`), synchronous and asynchronous.

    with ActionClient("http://127.0.0.1:8700") as actions:
        view = actions.run("traj-1", command=["python3", "-c", "print(6 * 7)"], timeout_s=10)
        print(view["status"], view["stdout"])
        actions.end_trajectory("traj-1")

    async with AsyncActionClient("http://127.0.0.1:8700") as actions:
        aid = await actions.submit("traj-1", command=["pytest", "-q"], cpu={"min": 1, "max": 4})
        view = await actions.wait(aid)

`run` is `submit` then `wait`. Views are the server's JSON (`status`, `exit_code`, `stdout`,
`stderr`, the ACT breakdown...). The server's 4xx and 5xx raise `ActionError` with its message;
`token` (or `LOOM_TOKEN`) is sent as a bearer token.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from loom.runtime.http_client import (
    AsyncHttpClient,
    HttpClient,
    ServiceError,
    checked,
)

__all__ = ["TERMINAL", "ActionClient", "ActionError", "AsyncActionClient"]

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out"})
_POLL_S = 60.0  # the server's longest long-poll


class ActionError(ServiceError):
    """The action server's error: `status`, what its `detail` says, and the kind its `error`
    code named (a 404 is also a `NotFound`)."""


def _check(resp: httpx.Response) -> Any:
    return checked(resp, ActionError.of)


def _body(trajectory_id: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {"trajectory_id": trajectory_id, **{k: v for k, v in fields.items() if v is not None}}


class _Deadline:
    def __init__(self, timeout_s: float | None) -> None:
        self.end = None if timeout_s is None else time.monotonic() + timeout_s

    def poll_s(self, action_id: str) -> float:
        if self.end is None:
            return _POLL_S
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"action {action_id} did not finish in time")
        return min(_POLL_S, left)


class ActionClient(HttpClient):
    """A synchronous client; `timeout_s` bounds one HTTP request."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = _POLL_S + 30.0,
        **httpx_options: Any,
    ) -> None:
        super().__init__(base_url, token=token, timeout_s=timeout_s, **httpx_options)

    def submit(self, trajectory_id: str, **fields: Any) -> str:
        """Queue an action (`command=`, `service=` or `api=`, and its options); its id."""
        return str(_check(self.http.post("/v1/actions", json=_body(trajectory_id, fields)))["id"])

    def get(self, action_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        out: dict[str, Any] = _check(
            self.http.get(f"/v1/actions/{action_id}", params={"wait_s": wait_s})
        )
        return out

    def wait(self, action_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Until the action is terminal (TimeoutError past `timeout_s`); its view."""
        deadline = _Deadline(timeout_s)
        while (view := self.get(action_id, deadline.poll_s(action_id)))["status"] not in TERMINAL:
            pass
        return view

    def run(
        self, trajectory_id: str, *, wait_timeout_s: float | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Submit and wait (at most `wait_timeout_s`): the terminal view. `timeout_s`, if
        given, is the action's own time limit, as in `submit`."""
        return self.wait(self.submit(trajectory_id, **fields), wait_timeout_s)

    def cancel(self, action_id: str) -> dict[str, Any]:
        out: dict[str, Any] = _check(self.http.delete(f"/v1/actions/{action_id}"))
        return out

    def end_trajectory(self, trajectory_id: str) -> dict[str, Any]:
        out: dict[str, Any] = _check(self.http.post(f"/v1/trajectories/{trajectory_id}/end"))
        return out

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = _check(self.http.get("/v1/stats"))
        return out


class AsyncActionClient(AsyncHttpClient):
    """The same operations, awaitable."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = _POLL_S + 30.0,
        **httpx_options: Any,
    ) -> None:
        super().__init__(base_url, token=token, timeout_s=timeout_s, **httpx_options)

    async def submit(self, trajectory_id: str, **fields: Any) -> str:
        resp = await self.http.post("/v1/actions", json=_body(trajectory_id, fields))
        return str(_check(resp)["id"])

    async def get(self, action_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        resp = await self.http.get(f"/v1/actions/{action_id}", params={"wait_s": wait_s})
        out: dict[str, Any] = _check(resp)
        return out

    async def wait(self, action_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        deadline = _Deadline(timeout_s)
        while True:
            view = await self.get(action_id, deadline.poll_s(action_id))
            if view["status"] in TERMINAL:
                return view

    async def run(
        self, trajectory_id: str, *, wait_timeout_s: float | None = None, **fields: Any
    ) -> dict[str, Any]:
        return await self.wait(await self.submit(trajectory_id, **fields), wait_timeout_s)

    async def cancel(self, action_id: str) -> dict[str, Any]:
        out: dict[str, Any] = _check(await self.http.delete(f"/v1/actions/{action_id}"))
        return out

    async def end_trajectory(self, trajectory_id: str) -> dict[str, Any]:
        out: dict[str, Any] = _check(await self.http.post(f"/v1/trajectories/{trajectory_id}/end"))
        return out

    async def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = _check(await self.http.get("/v1/stats"))
        return out
