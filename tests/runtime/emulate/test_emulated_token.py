"""An emulated engine with a token, as vLLM with `--api-key`: every route but health and
metrics wants it (a 401 in the same body as every Loom service's), and the engines of one fleet
move KV to each other with it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from loom.runtime.emulate import EmulatedProcess

SPEC = "qwen3-14b@h100:tp2"
TOKEN = "emulated-engine-token-0123"
ARGS = ("--time-scale", "0.1", "--stream-interval-ms", "0", "--token", TOKEN)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[EmulatedProcess, EmulatedProcess]]:
    with EmulatedProcess(SPEC, *ARGS) as a, EmulatedProcess(SPEC, *ARGS) as b:
        yield a, b


def _complete(url: str, headers: dict[str, str]) -> httpx.Response:
    body = {
        "prompt": list(range(1, 600)),
        "max_tokens": 4,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=120)


def test_only_the_token_gets_in_and_health_stays_open(pair) -> None:
    a, _ = pair
    assert httpx.get(f"{a.url}/health").status_code == 200
    assert httpx.get(f"{a.url}/metrics").status_code == 200
    for headers in ({}, {"Authorization": "Bearer not-the-token-at-all"}):
        refused = _complete(a.url, headers)
        assert refused.status_code == 401, refused.text
        assert refused.json()["error"]["kind"] == "unauthorized"
        assert TOKEN not in refused.text
        assert httpx.get(f"{a.url}/loom/kv", headers=headers).status_code == 401
    assert _complete(a.url, AUTH).status_code == 200


def test_engines_of_one_fleet_move_kv_with_its_token(pair) -> None:
    a, b = pair
    done = _complete(a.url, AUTH)
    assert done.status_code == 200, done.text
    context = list(range(1, 600)) + done.json()["choices"][0]["token_ids"]
    sent = httpx.post(
        f"{a.url}/loom/kv/send",
        json={"tokens": context, "to": b.url},
        headers=AUTH,
        timeout=60,
    )
    assert sent.status_code == 200, sent.text
    assert sent.json()["tokens"] == len(context)


def test_a_short_token_or_an_open_host_without_one_is_refused() -> None:
    with pytest.raises(RuntimeError, match="16 characters or more"):
        EmulatedProcess(SPEC, "--token", "short")
    with pytest.raises(RuntimeError, match="beyond loopback"):
        EmulatedProcess(SPEC, "--host", "0.0.0.0")
