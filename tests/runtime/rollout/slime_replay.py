"""slime's calls to a router and to the engines it lists, replayed with httpx in the order and
shapes slime (github.com/THUDM/slime) sends them; none of slime's code is copied or imported
(`test_router_slime_code.py` drives slime's own functions where a checkout is given).

Read at slime 624b824 (2026-08-21, after v0.3.1) and at the tags named below:

* registration, `SGLangEngine._register_to_router` (`slime/backends/sglang_utils/
  sglang_engine.py`): `POST /workers {"url", "worker_type"}`, then `raise_for_status`; with
  sglang-router <= 0.2.1 (slime <= v0.3.0) `POST /add_worker?url=`;
* generation, `slime/rollout/sglang_rollout.py:generate`: `POST /generate` to the router with
  `{"sampling_params", "return_logprob": true, "input_ids"}`; tokens and logprobs are read
  from `meta_info.output_token_logprobs`, the finish from `meta_info.finish_reason.type`;
* the end-of-step abort, `sglang_rollout.py:abort`: the urls of `GET /workers` (sglang-router
  <= 0.2.1: `GET /list_workers`, `urls`); since v0.3.1 (`server_control.py:
  abort_servers_until_idle`) each url at once runs a loop of `POST {url}/abort_request
  {"abort_all": true}` and `GET {url}/v1/loads?include=core`, summed by
  `num_requests_from_load`, until it reads zero, three seconds between rounds, and a url whose
  loads cannot be read ends its loop; before (v0.2.1-v0.3.0) one abort per url;
* deregistration, `SGLangEngine.shutdown`: `GET /workers`, the entry whose `url` is the
  engine's own, `DELETE /workers/{id}` ("not found" is a warning), then it kills the engine;
  sglang-router 0.2.x-0.3.0: `DELETE /workers/{quote(url)}`; <= 0.2.1: `POST /remove_worker?url=`.

slime's HTTP posts retry any failure up to 60 times a second apart (`http_utils._post`);
`retries` stands for that count here."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"


def register(router: str, engine: str) -> httpx.Response:
    resp = httpx.post(f"{router}/workers", json={"url": engine, "worker_type": "regular"})
    resp.raise_for_status()
    return resp


def register_old(router: str, engine: str) -> httpx.Response:
    resp = httpx.post(f"{router}/add_worker?url={engine}")
    resp.raise_for_status()
    return resp


def deregister(router: str, engine: str) -> str | None:
    """The id slime found and deleted, or None where it logs "not found"."""
    workers = httpx.get(f"{router}/workers").json()["workers"]
    found = next((w["id"] for w in workers if w["url"] == engine), None)
    if found is not None:
        httpx.delete(f"{router}/workers/{found}").raise_for_status()
    return found


def deregister_by_url(router: str, engine: str) -> None:
    httpx.delete(f"{router}/workers/{quote(engine, safe='')}").raise_for_status()


def deregister_old(router: str, engine: str) -> None:
    httpx.post(f"{router}/remove_worker?url={engine}").raise_for_status()


def sampling(max_new_tokens: int) -> dict[str, Any]:
    """`GenerateState`'s sampling params: every key, always."""
    return {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_new_tokens": max_new_tokens,
        "stop": None,
        "stop_token_ids": None,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }


def generate_body(prompt: Sequence[int], max_new_tokens: int) -> dict[str, Any]:
    return {
        "sampling_params": {**sampling(max_new_tokens), "ignore_eos": True},
        "return_logprob": True,
        "input_ids": list(prompt),
    }


def read_output(out: dict[str, Any]) -> tuple[list[int], list[float], str]:
    """What slime keeps of an answer: tokens, their logprobs, the finish."""
    pairs = out["meta_info"].get("output_token_logprobs") or []
    return [p[1] for p in pairs], [p[0] for p in pairs], out["meta_info"]["finish_reason"]["type"]


def num_requests(load: Any) -> int:
    """slime's reading of a `/v1/loads` answer: summed over lists and `loads`; per entry a
    total (`num_reqs`, `num_total_reqs`, `total_reqs`) or running plus waiting."""
    if isinstance(load, list):
        return sum(num_requests(x) for x in load)
    if not isinstance(load, dict):
        return 0
    if "loads" in load:
        return num_requests(load["loads"])
    for key in ("num_reqs", "num_total_reqs", "total_reqs"):
        if isinstance(load.get(key), int):
            return int(load[key])
    running = load.get("num_running_reqs", load.get("total_running_reqs"))
    waiting = load.get("num_waiting_reqs", load.get("total_waiting_reqs"))
    return sum(p for p in (running, waiting) if isinstance(p, int))


@dataclass
class UrlLoop:
    """What one url's abort loop saw."""

    url: str
    aborts: list[Any] = field(default_factory=list)  # each answer (JSON, text) or error
    loads: list[int] = field(default_factory=list)  # what each /v1/loads read summed to
    gave_up: str | None = None  # why the loop ended without reading zero


async def _post(client: httpx.AsyncClient, url: str, body: dict[str, Any], retries: int) -> Any:
    for attempt in range(retries):
        try:
            resp = await client.post(url, json=body)
            resp.raise_for_status()
            try:
                return resp.json()
            except ValueError:
                return resp.text
        except httpx.HTTPError:
            if attempt == retries - 1:
                raise
            await asyncio.sleep(1)
    raise AssertionError("unreachable")


async def _until_idle(
    client: httpx.AsyncClient, url: str, interval_s: float, retries: int, rounds: int
) -> UrlLoop:
    seen = UrlLoop(url)
    for _ in range(rounds):
        try:
            seen.aborts.append(
                await _post(client, f"{url}/abort_request", {"abort_all": True}, retries)
            )
        except httpx.HTTPError as exc:  # slime logs it and goes on to read the loads
            seen.aborts.append(f"error: {exc!r}")
        try:
            resp = await client.get(f"{url}/v1/loads?include=core")
            resp.raise_for_status()
            n = num_requests(resp.json())
        except (httpx.HTTPError, ValueError) as exc:  # slime logs it and ends this loop
            seen.gave_up = repr(exc)
            return seen
        seen.loads.append(n)
        if n <= 0:
            return seen
        await asyncio.sleep(interval_s)
    seen.gave_up = f"not idle after {rounds} rounds"
    return seen


def abort_until_idle(
    router: str, *, interval_s: float = 3.0, retries: int = 60, rounds: int = 40
) -> list[UrlLoop]:
    """slime >= v0.3.1: the urls `GET /workers` lists, each aborted until its loads read
    zero, all at once. `rounds` bounds what slime does not (a test must end)."""

    async def run() -> list[UrlLoop]:
        async with httpx.AsyncClient(timeout=None) as client:
            listed = (await client.get(f"{router}/workers")).json()["workers"]
            urls = [w["url"] for w in listed]
            return list(
                await asyncio.gather(
                    *(_until_idle(client, u, interval_s, retries, rounds) for u in urls)
                )
            )

    return asyncio.run(run())


def abort_once(
    router: str, *, listing: str = "/workers", together: bool = True, retries: int = 60
) -> dict[str, Any]:
    """slime v0.2.1-v0.3.0: the urls of `GET /workers` (`/list_workers` with sglang-router
    <= 0.2.1), one `abort_all` each, all at once (since v0.2.3; `together=False`: one after
    another, as v0.2.1 and v0.2.2); what each answered."""

    async def run() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=None) as client:
            got = (await client.get(f"{router}{listing}")).json()
            urls = got["urls"] if listing == "/list_workers" else [w["url"] for w in got["workers"]]
            body = {"abort_all": True}
            calls = [_post(client, f"{u}/abort_request", body, retries) for u in urls]
            if together:
                answers = await asyncio.gather(*calls, return_exceptions=True)
            else:
                answers = [await call for call in calls]
            return dict(zip(urls, answers, strict=True))

    return asyncio.run(run())
