"""An async client of the rollout router (`loom serve rollout`).

    async with RolloutClient("http://127.0.0.1:8800") as client:
        await client.declare([{"id": "q1-s0", "prompt": question}, ...])
        async with client.trajectory("q1-s0") as traj:
            out = await traj.chat([{"role": "user", "content": question}], max_tokens=256)
            ...  # call a tool, append its output, ask again
        # leaving the block ends the trajectory (the router learns its length)

Every request of a trajectory carries `X-Trajectory-Id`; the router's errors raise
`RolloutError` with the router's message and status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx

from loom.runtime.http_client import AsyncHttpClient, ServiceError, checked

__all__ = ["RolloutClient", "RolloutError", "TrajectoryHandle"]


class RolloutError(ServiceError):
    """The router's error: `status`, the message of its OpenAI-shaped error body, and the
    kind it named (a 404 is also a `NotFound`)."""


def _check(resp: httpx.Response) -> Any:
    return checked(resp, RolloutError.of)


class RolloutClient(AsyncHttpClient):
    """`base_url`: the router. `timeout_s` bounds one request (a long turn may take minutes)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 600.0,
        **httpx_options: Any,
    ) -> None:
        """`token`: the router's bearer token (None: `LOOM_TOKEN` if set)."""
        super().__init__(base_url, token=token, timeout_s=timeout_s, **httpx_options)

    async def declare(self, trajectories: Sequence[Mapping[str, Any]]) -> dict[str, str]:
        """Declare a batch before it starts (each: id, prompt_id or prompt, optional group and
        prompt_tokens); returns each trajectory's planned engine."""
        resp = await self.http.post("/v1/rollouts", json={"trajectories": list(trajectories)})
        plan: dict[str, str] = _check(resp)["plan"]
        return plan

    def trajectory(self, trajectory_id: str) -> TrajectoryHandle:
        return TrajectoryHandle(self, trajectory_id)

    async def end(self, trajectory_id: str) -> dict[str, Any]:
        out: dict[str, Any] = _check(await self.http.post(f"/v1/trajectories/{trajectory_id}/end"))
        return out

    async def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = _check(await self.http.get("/v1/stats"))
        return out

    async def _post(self, path: str, body: dict[str, Any], key: str | None) -> dict[str, Any]:
        headers = {"X-Trajectory-Id": key} if key is not None else {}
        out: dict[str, Any] = _check(await self.http.post(path, json=body, headers=headers))
        return out

    async def completion(
        self, prompt: str | list[int], *, trajectory_id: str | None = None, **params: Any
    ) -> dict[str, Any]:
        """OpenAI `/v1/completions` (a token-id prompt skips tokenization)."""
        return await self._post("/v1/completions", {"prompt": prompt, **params}, trajectory_id)

    async def chat(
        self, messages: list[dict[str, Any]], *, trajectory_id: str | None = None, **params: Any
    ) -> dict[str, Any]:
        """OpenAI `/v1/chat/completions`."""
        body = {"messages": messages, **params}
        return await self._post("/v1/chat/completions", body, trajectory_id)

    async def generate(
        self,
        input_ids: list[int],
        sampling_params: Mapping[str, Any] | None = None,
        *,
        trajectory_id: str | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """SGLang's native `/generate`, token in and token out; `fields` are more of its
        body's (`return_logprob`, `logprob_start_len`, ...)."""
        body = {"input_ids": input_ids, "sampling_params": dict(sampling_params or {}), **fields}
        return await self._post("/generate", body, trajectory_id)


class TrajectoryHandle:
    """The turns of one trajectory; an async context manager that ends it on exit."""

    def __init__(self, client: RolloutClient, trajectory_id: str) -> None:
        self.client = client
        self.id = trajectory_id
        self.ended = False

    async def __aenter__(self) -> TrajectoryHandle:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.ended:
            await self.end()

    async def end(self) -> dict[str, Any]:
        self.ended = True
        return await self.client.end(self.id)

    async def completion(self, prompt: str | list[int], **params: Any) -> dict[str, Any]:
        return await self.client.completion(prompt, trajectory_id=self.id, **params)

    async def chat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        return await self.client.chat(messages, trajectory_id=self.id, **params)

    async def generate(
        self,
        input_ids: list[int],
        sampling_params: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        return await self.client.generate(
            input_ids, sampling_params, trajectory_id=self.id, **fields
        )
