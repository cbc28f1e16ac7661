"""Small synchronous clients of a vLLM engine's OpenAI routes for the engine tests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

MODEL = "loom-tiny"
PROMPT = [5, 8, 9, 10, 44, 71, 300]  # token ids of the tiny model's vocabulary


def client() -> httpx.Client:
    return httpx.Client(trust_env=False, timeout=120.0)


def completion(http: httpx.Client, url: str, **body: Any) -> dict[str, Any]:
    """POST /v1/completions (token ids back, greedy) and return the JSON body of a 200."""
    body = {"model": MODEL, "return_token_ids": True, "temperature": 0, **body}
    resp = http.post(f"{url}/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


@dataclass
class Stream:
    """What one streamed completion sent: its parsed chunks, in order, and its token ids."""

    status: int = 0
    chunks: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False  # the `data: [DONE]` line arrived
    tokens: list[int] = field(default_factory=list)

    @property
    def choice_chunks(self) -> list[dict[str, Any]]:
        return [c for c in self.chunks if c["choices"]]

    @property
    def finish_reason(self) -> str | None:
        return self.choice_chunks[-1]["choices"][0]["finish_reason"]

    @property
    def usage(self) -> dict[str, Any] | None:
        return self.chunks[-1].get("usage")


def stream_completion(
    http: httpx.Client,
    url: str,
    on_tokens: Callable[[Stream], None] | None = None,
    **body: Any,
) -> Stream:
    """Stream /v1/completions with usage; `on_tokens(stream)` runs after each chunk."""
    body = {
        "model": MODEL,
        "return_token_ids": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **body,
    }
    out = Stream()
    with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
        out.status = resp.status_code
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out.done = True
                continue
            chunk = json.loads(line.removeprefix("data: "))
            out.chunks.append(chunk)
            if chunk["choices"]:
                out.tokens += chunk["choices"][0]["token_ids"] or []
                if on_tokens is not None:
                    on_tokens(out)
    return out


def abort(http: httpx.Client, url: str, *request_ids: str) -> httpx.Response:
    """vLLM's dev-mode abort route; a completion sent with `request_id: R` is `cmpl-R-0`."""
    return http.post(f"{url}/abort_requests", json={"request_ids": list(request_ids)})


class Background(threading.Thread):
    """Run `fn()` in a thread; `result()` joins it and returns (or raises) what it did."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._fn = fn
        self._value: Any = None
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:
            self._error = exc

    def result(self, timeout: float = 120.0) -> Any:
        self.join(timeout)
        assert not self.is_alive(), "background request did not finish"
        if self._error is not None:
            raise self._error
        return self._value


def metric(http: httpx.Client, url: str, name: str) -> float:
    """A `vllm:` sample of /metrics, summed over its labels (0 if absent)."""
    for attempt in range(3):
        try:  # the server may close a kept-alive connection as we reuse it: a GET is safe again
            text = http.get(f"{url}/metrics").text
            break
        except httpx.RemoteProtocolError:
            if attempt == 2:
                raise
    total = 0.0
    for line in text.splitlines():
        if line.startswith((f"vllm:{name}{{", f"vllm:{name} ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_metric(
    http: httpx.Client, url: str, name: str, at_least: float, timeout_s: float = 60.0
) -> None:
    """Until `metric(name) >= at_least`. NOTE: on loaded cores one /metrics call can take
    seconds, so a gauge may change and change back unseen: wait on counters where possible."""
    deadline = time.monotonic() + timeout_s
    while (value := metric(http, url, name)) < at_least:
        assert time.monotonic() < deadline, (
            f"vllm:{name} = {value} < {at_least} after {timeout_s} s"
        )
        time.sleep(0.05)
