"""KV moves between emulated engines (Heddle §5.3): the receiver's next request that begins
with the moved context finds it cached; both ends hold the blocks while the copy runs; the
copy takes the link's time (NVLink on one node, the network across); a copy that fails or is
refused frees both ends and neither engine stops serving; hostile requests get a 4xx that
says what was wrong."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from emulated_batch import config

from loom.core.errors import InvalidRequest
from loom.perf.transfer import KvLinks
from loom.runtime.emulate import EmulatedEngine, EmulatedProcess, Request
from loom.runtime.emulate.core import UnknownCopy
from loom.sim.engine import Engine

SPEC = "qwen3-14b@h100:tp2"


def _served(core: EmulatedEngine, prompt: list[int], out: int = 8) -> Request:
    """Serve one request to its end on the core's clock."""
    req = core.submit(f"r{len(core.log)}", prompt, out, ignore_eos=True)
    core.eng.run()
    assert req.finish_reason == "length"
    return req


def _context(n: int, seed: int = 1) -> list[int]:
    return [1 + (seed * 7919 + i * 31) % 9000 for i in range(n)]


# ---- the core: both ends of a copy ----------------------------------------------------------


def test_a_moved_context_is_found_cached_at_the_receiver() -> None:
    clock = Engine()
    a, b = EmulatedEngine(config(), clock), EmulatedEngine(config(), clock)
    ctx = _context(3000)
    context = ctx + _served(a, ctx).gen.tokens
    tid, n = a.hold_prefix([*context, 5, 6, 7])
    assert n == len(context) and tid >= 0
    free_before = b.worker._free()
    cid = b.reserve_prefix(context[:n], hold_s=10.0)
    assert cid is not None
    assert b.worker._free() == free_before - n  # the receiver's blocks are taken now
    assert b.commit_prefix(cid) == n
    a.release_prefix(tid, n)
    assert a.kv["sent_tokens"] == n and b.kv["received_tokens"] == n
    # the agent's next turn: the context and a tool's reply
    assert _served(b, context + _context(200, seed=2)).cached == n


def test_a_context_held_for_a_copy_survives_eviction() -> None:
    """Memory pressure evicts idle prefixes, never one a copy reads."""
    cfg = config(max_running=4)
    clock = Engine()
    a = EmulatedEngine(cfg, clock)
    ctx = _context(4000)
    held = ctx + _served(a, ctx).gen.tokens
    tid, n = a.hold_prefix(held)
    assert n == len(held)
    # fill the engine many times over with other contexts
    for seed in range(2, 2 + a.capacity // 20_000 + 4):
        _served(a, _context(20_000, seed=seed), out=1)
    assert a.worker.cached_tokens(tid) == n
    a.release_prefix(tid, 0)
    for seed in range(100, 100 + a.capacity // 20_000 + 4):
        _served(a, _context(20_000, seed=seed), out=1)
    assert a.worker.cached_tokens(tid) == 0  # released: evictable again


def test_no_room_is_a_refusal_and_an_expired_copy_frees_its_room() -> None:
    clock = Engine()
    b = EmulatedEngine(config(), clock)
    assert b.reserve_prefix(_context(b.capacity + 1), hold_s=1.0) is None
    free = b.worker._free()
    cid = b.reserve_prefix(_context(1000), hold_s=2.0)
    assert cid is not None and b.worker._free() == free - 1000
    clock.run(until=3.0)
    assert b.worker._free() == free and b.kv["expired"] == 1
    with pytest.raises(UnknownCopy):
        b.commit_prefix(cid)
    cid = b.reserve_prefix(_context(1000), hold_s=2.0)
    assert cid is not None
    b.cancel_prefix(cid)
    assert b.worker._free() == free
    with pytest.raises(InvalidRequest, match="at least"):
        b.reserve_prefix([1, 2, 3], hold_s=1.0)
    with pytest.raises(InvalidRequest, match="hold_s"):
        b.reserve_prefix(_context(100), hold_s=float("inf"))


def test_nothing_cached_is_nothing_to_send() -> None:
    a = EmulatedEngine(config(), Engine())
    assert a.hold_prefix(_context(500)) == (-1, 0)


def test_the_link_is_nvlink_on_a_node_and_the_network_across() -> None:
    here = KvLinks.of("qwen3-14b", "h100", node=0)
    same, other = KvLinks.of("qwen3-14b", "h100", node=0), KvLinks.of("qwen3-14b", "h100", node=1)
    tokens = 10_000
    nbytes = tokens * here.kv_bytes_per_token
    assert here.transfer_s(tokens, same) == pytest.approx(
        nbytes / (here.nvlink_gbs * 1e9), abs=1e-4
    )
    assert here.transfer_s(tokens, other) == pytest.approx(
        nbytes / (here.network_gbs * 1e9), abs=1e-4
    )
    assert here.transfer_s(tokens, other) > 5 * here.transfer_s(tokens, same)


# ---- over HTTP ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[EmulatedProcess, EmulatedProcess, EmulatedProcess]]:
    """Two engines on node 0 and one on node 1, ten times faster than the GPU."""
    args = ("--time-scale", "0.1", "--stream-interval-ms", "0")
    with (
        EmulatedProcess(SPEC, *args) as a,
        EmulatedProcess(SPEC, *args) as b,
        EmulatedProcess(SPEC, *args, "--node", "1") as c,
    ):
        yield a, b, c


def _complete(url: str, prompt: list[int], n: int = 16) -> dict:
    body = {"prompt": prompt, "max_tokens": n, "ignore_eos": True, "return_token_ids": True}
    resp = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_a_copy_over_http_is_found_cached_with_the_same_tokens(pair) -> None:
    a, b, c = pair
    ctx = _context(3000, seed=11)
    out = _complete(a.url, ctx)["choices"][0]["token_ids"]
    context = ctx + out
    sent = httpx.post(f"{a.url}/loom/kv/send", json={"tokens": context, "to": b.url}, timeout=60)
    assert sent.status_code == 200, sent.text
    moved = sent.json()
    assert moved["tokens"] == len(context)
    info = httpx.get(f"{a.url}/loom/kv").json()
    links = KvLinks(**info["links"])
    assert moved["seconds"] == pytest.approx(links.transfer_s(len(context), links))
    nxt = context + _context(100, seed=12)
    at_b, at_a = _complete(b.url, nxt), _complete(a.url, nxt)
    assert at_b["usage"]["prompt_tokens_details"]["cached_tokens"] == len(context)
    # the same tokens as where the context was computed
    assert at_b["choices"][0]["token_ids"] == at_a["choices"][0]["token_ids"]
    stats = httpx.get(f"{b.url}/debug/stats").json()["kv_moves"]
    assert stats["received"] >= 1 and stats["received_tokens"] >= len(context)
    # across nodes the copy takes the network's time
    far = httpx.post(f"{a.url}/loom/kv/send", json={"tokens": context, "to": c.url}, timeout=60)
    assert far.status_code == 200, far.text
    across = KvLinks(**httpx.get(f"{c.url}/loom/kv").json()["links"])
    assert far.json()["seconds"] == pytest.approx(links.transfer_s(len(context), across))
    assert far.json()["seconds"] > 5 * moved["seconds"]


def test_failed_and_hostile_copies_leave_both_engines_serving(pair) -> None:
    a, b, _ = pair
    ctx = _context(2000, seed=21)
    out = _complete(a.url, ctx)["choices"][0]["token_ids"]
    context = ctx + out
    send = f"{a.url}/loom/kv/send"
    # nothing cached there: nothing sent
    none = httpx.post(send, json={"tokens": _context(500, seed=99), "to": b.url})
    assert none.status_code == 200 and none.json()["tokens"] == 0
    # a receiver that is gone: a 502 naming it; the sender still serves
    dead = httpx.post(send, json={"tokens": context, "to": "http://127.0.0.1:9"}, timeout=60)
    assert dead.status_code == 502 and "127.0.0.1:9" in dead.json()["error"]["message"]
    # hostile requests: a 400 that says what was wrong
    for body, says in (
        ({"tokens": "abc", "to": b.url}, "tokens"),
        ({"tokens": context, "to": "http://example.com:80"}, "127.0.0.1"),
        ({"tokens": context, "to": "file:///etc/passwd"}, "127.0.0.1"),
        ({"tokens": context}, "to must be"),
        ({"tokens": context, "to": b.url, "hold_s": 5}, "unknown fields 'hold_s'"),
    ):
        resp = httpx.post(send, json=body)
        assert resp.status_code == 400 and says in resp.json()["error"]["message"], resp.text
    assert httpx.post(send, content=b"{nope").status_code == 400
    recv = f"{b.url}/loom/kv/receive"
    assert httpx.post(recv, json={"tokens": context, "hold_s": "x"}).status_code == 400
    evil = httpx.post(recv, json={"tokens": context, "hold_s": 5, "evil": 1})
    assert evil.status_code == 400 and "'evil'" in evil.json()["error"]["message"]
    assert httpx.post(f"{b.url}/loom/kv/commit", json={"id": 0, "x": 1}).status_code == 400
    assert httpx.post(recv, json={"tokens": [1] * 10**7, "hold_s": 5}).status_code == 507
    assert httpx.post(f"{b.url}/loom/kv/commit", json={"id": 10**9}).status_code == 404
    assert httpx.post(f"{b.url}/loom/kv/cancel", json={"id": True}).status_code == 400
    # both still serve, and the sender's context is still cached (the failed copy freed it)
    again = _complete(a.url, context + [7] * 20)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == len(context)
    _complete(b.url, _context(100, seed=31))
