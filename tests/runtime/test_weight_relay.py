"""The weight relay (ROSE §4.2): the in-memory store's invariants under random operations, and
`loom serve relay` as a real process on loopback, driven over real HTTP by `RelayClient`,
pushers and pullers in threads. Every HTTP wait is bounded by the client's timeout, every
thread by a join or result timeout."""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from loom.client import RelayClient
from loom.runtime.relay import (
    CatchUpKind,
    InMemoryStore,
    InvalidRequestError,
    ObjectMissingError,
    Puller,
    Pusher,
    RelayError,
    RelayUnreachableError,
    Role,
    StoreFullError,
    UnknownMemberError,
    UnknownVersionError,
    VersionConflictError,
    VersionNeededError,
    WeightStore,
    manifest_key,
    plan_catch_up,
    retention,
)
from loom.runtime.relay.framing import BatchDecoder, FramingError, frames
from loom.runtime.relay.process import RelayProcess
from loom.runtime.relay.store import Member, ObjectInfo

MiB = 1 << 20
TIMEOUT_S = 30.0  # the longest any one HTTP wait or thread join may take
TOKEN = "relay-token-for-tests-0123"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def blobs(seed: int, count: int, size: int) -> list[tuple[str, bytes]]:
    """`count` named random blobs of about `size` bytes each (sizes differ, so blobs straddle
    bucket boundaries)."""
    rng = random.Random(seed)
    return [
        (f"layer{i}.weight", rng.randbytes(size + rng.randrange(size // 2 + 1)))
        for i in range(count)
    ]


# -- the relay as a process -------------------------------------------------------------------


@pytest.fixture(scope="module")
def relay_proc() -> Iterator[RelayProcess]:
    with RelayProcess.start("--max-bytes", "1G", "--max-object-bytes", "96M") as proc:
        yield proc


@pytest.fixture
def relay(relay_proc: RelayProcess) -> Iterator[RelayClient]:
    """A client of the shared relay, emptied first (no objects, no members)."""
    with RelayClient(relay_proc.url, timeout_s=TIMEOUT_S, trust_env=False) as client:
        for m in client.members():
            client.leave(m.member_id)
        for info in client.list():
            client.delete(info.key)
        yield client


@pytest.fixture
def start_relay() -> Iterator[Callable[..., RelayProcess]]:
    """Start a relay of its own (flags as arguments); killed at the end."""
    procs: list[RelayProcess] = []

    def start(*args: str) -> RelayProcess:
        proc = RelayProcess.start(*args)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()


def test_the_relay_binds_loopback_and_says_its_port(relay_proc: RelayProcess) -> None:
    assert relay_proc.url.startswith("http://127.0.0.1:")
    assert int(relay_proc.url.rsplit(":", 1)[1]) > 0
    assert httpx.get(f"{relay_proc.url}/healthz", trust_env=False).json() == {"status": "ok"}


# -- objects over HTTP ------------------------------------------------------------------------


def test_put_get_delete_list_round_trip(relay: RelayClient) -> None:
    rng = random.Random(1)
    sent = {f"t/obj{i}": rng.randbytes(n) for i, n in enumerate([0, 1, 4096, 3 * MiB + 7])}
    for key, data in sent.items():
        assert relay.put(key, data, version=7) == ObjectInfo(key=key, version=7, size=len(data))
    for key, data in sent.items():
        assert sha(relay.get(key)) == sha(data)
        assert relay.get_with_version(key)[1] == 7
    listed = relay.list(version=7, prefix="t/")
    assert [(i.key, i.size) for i in listed] == sorted((k, len(d)) for k, d in sent.items())
    assert relay.list(version=8) == [] and relay.list(prefix="u/") == []
    assert relay.stats()["bytes"] == sum(map(len, sent.values()))
    gone = relay.delete("t/obj3")
    assert (gone.size, gone.version) == (3 * MiB + 7, 7)
    with pytest.raises(ObjectMissingError, match="t/obj3"):
        relay.get("t/obj3")
    with pytest.raises(ObjectMissingError):
        relay.delete("t/obj3")
    assert [i.key for i in relay.list()] == ["t/obj0", "t/obj1", "t/obj2"]


def test_a_key_keeps_its_version_and_a_retry_replaces_its_bytes(relay: RelayClient) -> None:
    relay.put("k", b"first", 3)
    relay.put("k", b"second, longer", 3)  # a retried push
    assert relay.get("k") == b"second, longer"
    assert relay.stats()["bytes"] == len(b"second, longer")
    with pytest.raises(VersionConflictError, match="version 3") as err:
        relay.put("k", b"other", 4)
    assert err.value.status == 409
    assert relay.get_with_version("k") == (b"second, longer", 3)


def test_batch_get_answers_many_objects_in_the_order_asked(relay: RelayClient) -> None:
    rng = random.Random(2)
    sent = {f"b/{i:03d}": rng.randbytes(rng.randrange(0, 300_000)) for i in range(40)}
    for key, data in sent.items():
        relay.put(key, data, version=1)
    keys = list(sent)
    rng.shuffle(keys)
    got = relay.get_many(keys)
    assert list(got) == keys
    assert {k: sha(v) for k, v in got.items()} == {k: sha(sent[k]) for k in keys}
    assert relay.get_many([]) == {}
    with pytest.raises(ObjectMissingError, match="b/nope"):
        relay.get_many([keys[0], "b/nope"])
    with pytest.raises(InvalidRequestError, match="twice"):
        relay.get_many([keys[0], keys[0]])


def test_metrics_count_bytes_stored_put_and_read(
    relay: RelayClient, relay_proc: RelayProcess
) -> None:
    def scrape() -> dict[str, float]:
        text = httpx.get(f"{relay_proc.url}/metrics", trust_env=False).text
        return {
            line.split()[0]: float(line.split()[1])
            for line in text.splitlines()
            if line.startswith("loom_relay") and "{" not in line
        }

    before = scrape()
    relay.put("m/a", b"x" * 1000, 1)
    relay.get("m/a")
    relay.get_many(["m/a"])
    after = scrape()
    assert after["loom_relay_stored_bytes"] == 1000
    assert after["loom_relay_objects"] == 1
    assert after["loom_relay_put_bytes_total"] - before["loom_relay_put_bytes_total"] == 1000
    assert after["loom_relay_get_objects_total"] - before["loom_relay_get_objects_total"] == 2
    assert after["loom_relay_get_bytes_total"] - before["loom_relay_get_bytes_total"] >= 2000


# -- pushers, pullers, members ----------------------------------------------------------------


def test_two_pushers_and_three_pullers_while_members_come_and_go(relay: RelayClient) -> None:
    # Two training ranks push their shards of version 1 in 1 MiB buckets; three serving ranks
    # wait for them and pull in 3 MiB batches. One puller leaves after its first batch, one
    # member joins mid-transfer. Then version 2 brings a dense and a delta stream per shard:
    # the member that holds 1 takes the deltas, the one that holds nothing the dense weights.
    shards = {f"dense/r{r}": blobs(seed=10 + r, count=12, size=400_000) for r in (0, 1)}
    pusher_of = {
        s: Pusher(relay, bucket_bytes=MiB, workers=3, member_id=f"train-{i}")
        for i, s in enumerate(shards)
    }
    pulled: dict[str, dict[str, dict[str, bytes]]] = {}
    first_batch = threading.Barrier(4)  # three pullers and the member that joins mid-transfer

    def pull_all(member: str, leave_early: bool) -> None:
        relay.join(member, Role.SERVE)
        puller = Puller(relay, batch_bytes=3 * MiB)
        pulled[member] = {}
        for stream in shards:
            manifest = puller.wait_manifest(1, stream, timeout_s=TIMEOUT_S)
            got = pulled[member][stream] = {}
            for name, data in puller.iter_pull(manifest):
                got[name] = data
                if stream == "dense/r0" and len(got) == 1:
                    first_batch.wait(TIMEOUT_S)
                    if leave_early:
                        relay.leave(member)
                        return
        relay.join(member, Role.SERVE, version=1)

    def join_midway() -> None:
        first_batch.wait(TIMEOUT_S)
        relay.join("late", Role.SERVE)

    with ThreadPoolExecutor(6) as pool:
        pulls = [pool.submit(pull_all, f"serve-{i}", leave_early=i == 2) for i in range(3)]
        late = pool.submit(join_midway)
        pushes = [pool.submit(pusher_of[s].push, 1, s, shards[s]) for s in shards]
        for f in [*pushes, *pulls, late]:
            f.result(TIMEOUT_S)
    for member in ("serve-0", "serve-1"):
        for stream, sent in shards.items():
            assert {n: sha(d) for n, d in pulled[member][stream].items()} == {
                n: sha(d) for n, d in sent
            }, (member, stream)
    assert len(pulled["serve-2"]["dense/r0"]) == 1  # it left after its first batch
    assert {m.member_id: m.version for m in relay.members()} == {
        "serve-0": 1,
        "serve-1": 1,
        "late": None,
        "train-0": 1,
        "train-1": 1,
    }

    new = {
        f"{kind}/r{r}": blobs(seed=20 + 2 * r + (kind == "delta"), count=6, size=200_000)
        for kind in ("dense", "delta")
        for r in (0, 1)
    }
    with ThreadPoolExecutor(2) as pool:
        pushes = []
        for stream, sent in new.items():
            pusher = Pusher(relay, bucket_bytes=MiB, member_id=f"train-{stream[-1]}")
            pushes.append(pool.submit(pusher.push, 2, stream, sent))
        for f in pushes:
            f.result(TIMEOUT_S)
    puller = Puller(relay, batch_bytes=3 * MiB)
    for held, kind in ((1, CatchUpKind.DELTA), (None, CatchUpKind.DENSE)):
        for r in (0, 1):
            plan = puller.catch_up(held, dense=f"dense/r{r}", delta=f"delta/r{r}")
            assert plan.kind is kind and plan.target == 2
            ((version, stream),) = plan.steps
            got = puller.pull(version, stream)
            assert {n: sha(d) for n, d in got.items()} == {n: sha(d) for n, d in new[stream]}


def test_a_member_two_versions_behind_is_told_to_pull_dense(relay: RelayClient) -> None:
    for v in (1, 2, 3):
        for kind in ("dense", "delta"):
            Pusher(relay, bucket_bytes=MiB).push(v, kind, blobs(seed=v, count=2, size=1000))
    relay.join("b", Role.SERVE, version=2)  # holds 2: needs the delta of 3 only
    assert [v.version for v in relay.versions()] == [3]  # 1 and 2 dropped on its join
    relay.join("a", Role.SERVE, version=1)  # holds 1 (v - 2): the delta of 2 is gone
    puller = Puller(relay)
    behind = puller.catch_up(1)
    assert behind.kind is CatchUpKind.DENSE and behind.steps == ((3, "dense"),)
    assert "delta of 2 is not stored" in behind.reason
    assert puller.catch_up(2).steps == ((3, "delta"),)
    assert puller.catch_up(3).kind is CatchUpKind.CURRENT
    with pytest.raises(ObjectMissingError):
        relay.get(manifest_key(2, "delta"))


def test_garbage_collection_keeps_what_a_live_member_needs(relay: RelayClient) -> None:
    for v in range(1, 6):
        relay.put(f"v{v}/dense/b000000", bytes([v]) * 100, v)
    relay.join("a", Role.SERVE, version=2)  # needs 3, 4, 5
    relay.join("b", Role.SERVE, version=4)  # needs 5
    relay.join("t", Role.TRAIN, version=5)  # publishes 5: keeps 4, the last whole version
    assert [v.version for v in relay.versions()] == [3, 4, 5]
    assert all(v.needed for v in relay.versions())
    with pytest.raises(VersionNeededError, match="'a' at version 2") as err:
        relay.drop_version(3)
    assert err.value.status == 409
    relay.leave("a")
    assert [v.version for v in relay.versions()] == [4, 5]
    relay.leave("t")
    assert [v.version for v in relay.versions()] == [5]
    with pytest.raises(VersionNeededError, match="newest"):
        relay.drop_version(5)
    with pytest.raises(UnknownVersionError):
        relay.drop_version(99)
    relay.leave("b")
    relay.put("v6/dense/b000000", b"six", 6)  # no membership change: 5 stays until collected
    assert relay.drop_version(5).size == 100
    assert relay.collect() == []
    with pytest.raises(UnknownMemberError):
        relay.leave("a")


# -- refusals ---------------------------------------------------------------------------------


def test_the_memory_cap_refuses_whole_objects_with_507(
    start_relay: Callable[..., RelayProcess],
) -> None:
    proc = start_relay("--max-bytes", "8M", "--max-object-bytes", "6M")
    with RelayClient(proc.url, timeout_s=TIMEOUT_S, trust_env=False) as relay:
        first = os.urandom(5 * MiB)
        relay.put("a", first, 1)
        with pytest.raises(StoreFullError, match="cap") as err:
            relay.put("b", os.urandom(4 * MiB), 1)
        assert err.value.status == 507
        with pytest.raises(ObjectMissingError):
            relay.get("b")
        assert relay.stats()["bytes"] == 5 * MiB and [i.key for i in relay.list()] == ["a"]
        relay.put("a", os.urandom(6 * MiB), 1)  # replacing: the old bytes make room
        relay.put("a", first, 1)
        # a chunked body (no Content-Length) past the cap is read, then refused whole
        chunks = (os.urandom(MiB) for _ in range(4))
        r = httpx.put(
            f"{proc.url}/v1/objects/c", params={"version": 1}, content=chunks, trust_env=False
        )
        assert r.status_code == 507 and r.json()["error"] == "store_full"
        # a pusher refused midway never writes its manifest: the stream is not whole
        with pytest.raises(StoreFullError):
            Pusher(relay, bucket_bytes=MiB).push(2, "dense", blobs(seed=3, count=4, size=MiB))
        with pytest.raises(ObjectMissingError):
            relay.get(manifest_key(2, "dense"))
        assert sha(relay.get("a")) == sha(first)
        assert relay.stats()["bytes"] <= 8 * MiB


def test_malformed_requests_get_a_4xx_with_a_message(
    start_relay: Callable[..., RelayProcess],
) -> None:
    proc = start_relay("--max-object-bytes", "1M")
    with httpx.Client(base_url=proc.url, trust_env=False, timeout=TIMEOUT_S) as http:
        cases: list[tuple[httpx.Response, int, str]] = [
            (http.put("/v1/objects/a%20b", params={"version": 1}, content=b"x"), 400, "bad key"),
            (http.put("/v1/objects/a//b", params={"version": 1}, content=b"x"), 400, "bad key"),
            (http.put("/v1/objects/", params={"version": 1}, content=b"x"), 400, "bad key"),
            (
                http.put("/v1/objects/" + "k" * 600, params={"version": 1}, content=b"x"),
                400,
                "longer",
            ),
            (http.put("/v1/objects/a", content=b"x"), 400, "version"),
            (http.put("/v1/objects/a", params={"version": -1}, content=b"x"), 400, "version"),
            (http.put("/v1/objects/a", params={"version": "two"}, content=b"x"), 400, "version"),
            (
                http.put("/v1/objects/a", params={"version": 1}, content=os.urandom(MiB + 1)),
                413,
                "--max-object-bytes",
            ),
            (
                http.put(
                    "/v1/objects/a", params={"version": 1}, content=iter([os.urandom(MiB)] * 2)
                ),
                413,
                "--max-object-bytes",
            ),
            (http.get("/v1/objects/missing"), 404, "no object 'missing'"),
            (
                http.post(
                    "/v1/objects:batch",
                    content=b"not json",
                    headers={"Content-Type": "application/json"},
                ),
                400,
                "json",
            ),
            (http.post("/v1/objects:batch", content=b"not json"), 400, "body"),
            (http.post("/v1/objects:batch", json={"keys": ["../x"]}), 400, "bad key"),
            (http.post("/v1/objects:batch", json={"keys": "a"}), 400, "keys"),
            (http.post("/v1/members/m", json={"role": "boss"}), 400, "role"),
            (http.post("/v1/members/-m", json={"role": "serve"}), 400, "member id"),
            (http.delete("/v1/members/ghost"), 404, "no live member"),
            (http.delete("/v1/versions/x"), 400, "version"),
            (http.get("/v1/objects", params={"version": "x"}), 400, "version"),
            (http.get("/v1/nowhere"), 404, "Not Found"),
            (http.post("/v1/objects/a"), 405, "Method Not Allowed"),
        ]
        for resp, status, says in cases:
            what = f"{resp.request.method} {resp.request.url}"
            assert resp.status_code == status, (what, resp.text)
            assert says.lower() in resp.text.lower(), (what, resp.text)
        assert http.get("/v1/stats").json()["objects"] == 0  # nothing of it stored


def test_with_a_token_every_route_but_health_and_metrics_needs_it(
    start_relay: Callable[..., RelayProcess],
) -> None:
    proc = start_relay("--token", TOKEN)
    assert httpx.get(f"{proc.url}/healthz", trust_env=False).status_code == 200
    assert httpx.get(f"{proc.url}/metrics", trust_env=False).status_code == 200
    with httpx.Client(base_url=proc.url, trust_env=False, timeout=TIMEOUT_S) as http:
        for method, path in (
            ("GET", "/v1/objects"),
            ("PUT", "/v1/objects/a?version=1"),
            ("POST", "/v1/objects:batch"),
        ):
            r = http.request(method, path, content=b"{}")
            assert r.status_code == 401 and "token" in r.text, (method, path)
    with (
        RelayClient(proc.url, token="wrong-token-0123456789", trust_env=False) as relay,
        pytest.raises(RelayError) as err,
    ):
        relay.list()
    assert err.value.status == 401
    with RelayClient(proc.url, token=TOKEN, timeout_s=TIMEOUT_S, trust_env=False) as relay:
        relay.put("a", b"weights", 1)
        assert relay.get_many(["a"]) == {"a": b"weights"}


def test_the_cli_refuses_to_bind_beyond_loopback_without_a_token() -> None:
    from typer.testing import CliRunner

    from loom.cli import app

    out = CliRunner().invoke(app, ["serve", "relay", "--host", "0.0.0.0", "--port", "0"])
    assert out.exit_code != 0 and "token" in out.output
    out = CliRunner().invoke(app, ["serve", "relay", "--max-bytes", "lots"])
    assert out.exit_code != 0 and "not a size" in out.output


def test_a_relay_killed_mid_pull_raises_a_clear_error(
    start_relay: Callable[..., RelayProcess],
) -> None:
    proc = start_relay("--max-bytes", "512M", "--max-object-bytes", "64M")
    with RelayClient(proc.url, timeout_s=TIMEOUT_S, trust_env=False) as relay:
        keys = [f"v1/dense/b{i:06d}" for i in range(4)]
        payload = os.urandom(32 * MiB)
        for key in keys:
            relay.put(key, payload, 1)
        pulled = threading.Event()
        failure: list[BaseException] = []

        def pull_until_it_fails() -> None:
            try:
                while True:
                    relay.get_many(keys)
                    pulled.set()
            except BaseException as exc:
                failure.append(exc)

        puller = threading.Thread(target=pull_until_it_fails, daemon=True)
        puller.start()
        assert pulled.wait(TIMEOUT_S)
        time.sleep(0.05)  # into the next pull of 128 MiB
        proc.kill()
        puller.join(TIMEOUT_S)
        assert not puller.is_alive(), "the client hung after the relay died"
        (exc,) = failure
        assert isinstance(exc, RelayUnreachableError), repr(exc)
        assert proc.url in str(exc) and "no whole answer" in str(exc)
        with pytest.raises(RelayUnreachableError, match="ConnectError"):
            relay.get(keys[0])


# -- one interface, two stores ----------------------------------------------------------------


@pytest.fixture(params=["memory", "http"])
def store(request: pytest.FixtureRequest) -> WeightStore:
    if request.param == "memory":
        return InMemoryStore(1 << 30)
    client: RelayClient = request.getfixturevalue("relay")
    return client


def test_both_stores_implement_the_interface_alike(store: WeightStore) -> None:
    assert isinstance(store, WeightStore)
    sent = blobs(seed=5, count=9, size=150_000)
    manifest = Pusher(store, bucket_bytes=256 * 1024, workers=2).push(4, "dense", sent)
    assert manifest.buckets == len(store.list(version=4)) - 1  # and the manifest
    assert Puller(store, batch_bytes=MiB).pull(4, "dense") == dict(sent)
    assert store.join("s", Role.SERVE, 4) == Member(member_id="s", role=Role.SERVE, version=4)
    assert [v.version for v in store.versions()] == [4]
    with pytest.raises(InvalidRequestError):
        store.put("bad key", b"", 1)
    with pytest.raises(InvalidRequestError):
        store.join("s", "boss")  # type: ignore[arg-type]
    assert store.leave("s").version == 4 and store.members() == []


# -- units: no process -------------------------------------------------------------------------


def test_members_who_go_silent_expire() -> None:
    now = [0.0]
    store = InMemoryStore(1 << 20, member_ttl_s=10.0, clock=lambda: now[0])
    for v in (1, 2, 3):
        store.put(f"v{v}", b"w", v)
    store.join("slow", Role.SERVE, version=1)
    now[0] = 5.0
    store.join("fast", Role.SERVE, version=2)
    assert [v.version for v in store.versions()] == [2, 3]
    now[0] = 12.0  # "slow" silent for 12 s, "fast" for 7
    assert [m.member_id for m in store.members()] == ["fast"]
    assert [v.version for v in store.versions()] == [3]  # expiry collects too


def test_catch_up_plans() -> None:
    both = {"dense", "delta"}
    assert plan_catch_up(None, {}).kind is CatchUpKind.NONE
    assert plan_catch_up(3, {1: both, 2: both, 3: both}).kind is CatchUpKind.CURRENT
    assert plan_catch_up(1, {1: both, 2: both, 3: both}).steps == ((2, "delta"), (3, "delta"))
    assert plan_catch_up(1, {1: both, 3: both}).steps == ((3, "dense"),)
    # no dense at the newest: a dense base, then the deltas after it
    assert plan_catch_up(None, {2: both, 3: {"delta"}}).steps == ((2, "dense"), (3, "delta"))
    # the newest cannot be reached at all: the newest that can
    assert plan_catch_up(None, {2: both, 4: {"delta"}}).steps == ((2, "dense"),)
    stuck = plan_catch_up(2, {2: both, 4: {"delta"}})
    assert stuck.kind is CatchUpKind.NONE and stuck.target == 2


@given(
    sizes=st.lists(st.integers(0, 5000), max_size=12),
    bucket=st.integers(1, 4096),
    batch=st.integers(1, 20000),
)
@settings(max_examples=60, deadline=None)
def test_push_then_pull_returns_every_blob(sizes: list[int], bucket: int, batch: int) -> None:
    rng = random.Random(len(sizes) * 7919 + bucket)
    sent = [(f"p{i}", rng.randbytes(n)) for i, n in enumerate(sizes)]
    store = InMemoryStore(1 << 24)
    manifest = Pusher(store, bucket_bytes=bucket, workers=2).push(1, "s", sent)
    stored = [store.get(k) for k in manifest.bucket_keys()]
    assert all(len(b) == bucket for b in stored[:-1])
    puller = Puller(store, batch_bytes=batch)
    groups = puller.batches(manifest)
    assert [k for g in groups for k in g] == manifest.bucket_keys()
    assert all(sum(len(store.get(k)) for k in g) >= batch for g in groups[:-1])
    assert list(puller.iter_pull(manifest)) == sent


def test_a_pusher_takes_any_buffer_and_sends_a_whole_bucket_uncopied() -> None:
    import numpy as np

    weights = np.arange(24, dtype=np.float32).reshape(4, 6)
    exact = os.urandom(4096)
    store = InMemoryStore(1 << 20)
    manifest = Pusher(store, bucket_bytes=4096).push(1, "s", [("b", exact), ("w", weights)])
    assert [(e.name, e.offset, e.size) for e in manifest.entries] == [
        ("b", 0, 4096),
        ("w", 4096, 96),
    ]
    assert store.get(manifest.bucket_keys()[0]) is exact
    got = Puller(store).pull(1, "s")
    assert got["b"] is exact  # a blob that is a whole bucket comes back uncopied too
    assert np.array_equal(np.frombuffer(got["w"], dtype=np.float32).reshape(4, 6), weights)


@given(
    objects=st.lists(st.binary(max_size=300), max_size=8),
    cuts=st.lists(st.integers(1, 400), max_size=30),
)
@settings(max_examples=80, deadline=None)
def test_a_batch_body_decodes_however_it_is_chunked(objects: list[bytes], cuts: list[int]) -> None:
    infos = [(ObjectInfo(key=f"k{i}", version=i, size=len(d)), d) for i, d in enumerate(objects)]
    length, pieces = frames(infos)
    body = b"".join(pieces)
    assert len(body) == length
    decoder = BatchDecoder()
    at = 0
    for cut in cuts:
        decoder.feed(body[at : at + cut])
        at += cut
    decoder.feed(body[at:])
    assert decoder.finish() == {f"k{i}": (d, i) for i, d in enumerate(objects)}
    if objects and any(objects):
        short = BatchDecoder()
        short.feed(body[:-1])
        with pytest.raises(FramingError, match="cut short"):
            short.finish()


KEYS = [f"v/{i}" for i in range(6)]
MEMBERS = ["m0", "m1", "m2"]


class StoreMachine(RuleBasedStateMachine):
    """Random puts, deletes, joins, leaves, drops and collections against a small cap, checked
    against a model: listed sizes equal the bytes stored, never above the cap, and no version
    a live member may need is ever dropped."""

    CAP = 2000
    AUTO = False  # collect on every membership change

    def __init__(self) -> None:
        super().__init__()
        self.store = InMemoryStore(self.CAP, auto_collect=self.AUTO)
        self.model: dict[str, tuple[int, bytes]] = {}  # key -> (version, data)
        self.members: dict[str, Member] = {}

    def _floor(self) -> int | None:
        present = sorted({v for v, _ in self.model.values()})
        return retention.floor(present, self.members.values())

    @rule(key=st.sampled_from(KEYS), version=st.integers(0, 5), size=st.integers(0, 900))
    def put(self, key: str, version: int, size: int) -> None:
        data = bytes([version]) * size
        old = self.model.get(key)
        used = sum(len(d) for _, d in self.model.values()) - (len(old[1]) if old else 0)
        try:
            self.store.put(key, data, version)
        except VersionConflictError:
            assert old is not None and old[0] != version
        except StoreFullError:
            assert used + size > self.CAP
        else:
            assert old is None or old[0] == version
            assert used + size <= self.CAP
            self.model[key] = (version, data)

    @rule(key=st.sampled_from(KEYS))
    def delete(self, key: str) -> None:
        try:
            info = self.store.delete(key)
        except ObjectMissingError:
            assert key not in self.model
        else:
            assert self.model.pop(key)[0] == info.version

    @rule(
        member=st.sampled_from(MEMBERS),
        role=st.sampled_from(Role),
        version=st.none() | st.integers(0, 6),
    )
    def join(self, member: str, role: Role, version: int | None) -> None:
        self.members[member] = self.store.join(member, role, version)
        if self.AUTO:
            self._collected()

    @rule(member=st.sampled_from(MEMBERS))
    def leave(self, member: str) -> None:
        try:
            self.store.leave(member)
        except UnknownMemberError:
            assert member not in self.members
        else:
            del self.members[member]
            if self.AUTO:
                self._collected()

    def _collected(self) -> None:
        """The model after the store collected: only what is below the floor is gone."""
        floor = self._floor()
        self.model = {k: (v, d) for k, (v, d) in self.model.items() if floor is None or v >= floor}

    @rule(version=st.integers(0, 6))
    def drop_version(self, version: int) -> None:
        floor = self._floor()
        try:
            self.store.drop_version(version)
        except UnknownVersionError:
            assert all(v != version for v, _ in self.model.values())
        except VersionNeededError:
            assert floor is not None and version >= floor
        else:
            assert floor is not None and version < floor, "a needed version was dropped"
            self.model = {k: (v, d) for k, (v, d) in self.model.items() if v != version}

    @precondition(lambda self: bool(self.model))
    @rule()
    def collect(self) -> None:
        floor = self._floor()
        dropped = self.store.collect()
        assert floor is not None and all(v < floor for v in dropped)
        self.model = {k: (v, d) for k, (v, d) in self.model.items() if v not in dropped}
        assert all(v >= floor for v, _ in self.model.values())

    @invariant()
    def accounts_for_every_byte(self) -> None:
        listed = self.store.list()
        assert {i.key: (i.version, i.size) for i in listed} == {
            k: (v, len(d)) for k, (v, d) in self.model.items()
        }
        stored = self.store.stats().bytes
        assert stored == sum(i.size for i in listed) <= self.CAP
        for key, (_, data) in self.model.items():
            assert self.store.get(key) == data
        assert sorted(m.member_id for m in self.store.members()) == sorted(self.members)


class AutoCollectMachine(StoreMachine):
    AUTO = True


_MACHINE = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
StoreMachine.TestCase.settings = _MACHINE
AutoCollectMachine.TestCase.settings = _MACHINE
test_the_in_memory_store_keeps_its_invariants = StoreMachine.TestCase
test_the_store_collecting_on_membership_changes_keeps_them = AutoCollectMachine.TestCase


@given(
    present=st.lists(st.integers(0, 20), min_size=1, max_size=8, unique=True).map(sorted),
    members=st.lists(
        st.builds(
            Member,
            member_id=st.sampled_from(MEMBERS),
            role=st.sampled_from(Role),
            version=st.none() | st.integers(0, 22),
        ),
        max_size=4,
    ),
)
def test_the_floor_keeps_each_members_next_versions(
    present: list[int], members: list[Member]
) -> None:
    floor = retention.floor(present, members)
    assert floor is not None and floor <= present[-1]
    for m in members:
        if m.role is Role.SERVE and m.version is not None:
            assert all(v >= floor for v in present if v > m.version)
        if m.role is Role.TRAIN and m.version is not None:
            older = [v for v in present if v < m.version]
            if older:
                assert max(older) >= floor  # the last whole version stays while it publishes
    assert all(retention.needed_by(v, present, members) for v in present if v >= floor)
