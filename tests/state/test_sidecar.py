"""The StateManager as a per-node sidecar process (PlexRL §5.3), met as workers meet it: ranks
on their own connections export their memory (shared memory here, CUDA IPC on a GPU), the
sidecar copies each logical tensor once and answers every rank; a load fills fresh buffers bit
for bit; the scheduler's plan picks what spills; checkpoints, rollout shards and migration to
another node's sidecar come from the managed state; a stranger's connection is dropped unread
and a rank that never comes is reported by number; a stopped deployment's waiting ranks are
let go."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from loom.state.manager import StateKey  # noqa: E402
from loom.state.sidecar import (  # noqa: E402
    SidecarConfig,
    StateClient,
    StateError,
    StateSidecar,
    wire,
)
from loom.state.weights.params import ParamSpec, ShardRule  # noqa: E402

pytestmark = [pytest.mark.torch]

KB = 1 << 10


def state_of(model: str, seed: int, n: int = 3) -> dict[StateKey, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(n):
        out[StateKey(model, "weights", f"w{i}")] = torch.randn(32, 16, generator=g).to(
            torch.bfloat16
        )
        out[StateKey(model, "optimizer", f"m{i}")] = torch.randn(32, 16, generator=g)
    return out


def nbytes(state: dict[StateKey, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def ranks(world: int, fn: Callable[[int, StateClient], Any], sc: StateSidecar) -> dict[int, Any]:
    """Run `fn` as each of `world` ranks, each on its own connection, concurrently."""
    out: dict[int, Any] = {}
    errors: list[BaseException] = []

    def one(r: int) -> None:
        try:
            with sc.client(timeout_s=60) as c:
                out[r] = fn(r, c)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return out


@pytest.fixture
def sidecar(tmp_path: Path):  # type: ignore[no-untyped-def]
    with StateSidecar(
        SidecarConfig(gpus=2, host_bytes=20 * KB, disk_bytes=1 << 20, disk_dir=str(tmp_path))
    ) as sc:
        yield sc


def test_ranks_offload_once_per_key_and_load_back_bit_identical(sidecar: StateSidecar) -> None:
    state = state_of("a", 1)
    written = ranks(
        2, lambda r, c: c.offload("a", r, 2, r, {k: v.clone() for k, v in state.items()}), sidecar
    )
    assert sorted(written.values()) == [0, nbytes(state)]  # replicas stored once
    with sidecar.client() as c:
        st = c.call("stats")
    assert st["bytes_by_tier"] == {"device": 0, "host": nbytes(state), "disk": 0}
    assert st["unique_logical_bytes"] == nbytes(state)
    loaded = ranks(2, lambda r, c: c.load("a", r, 2), sidecar)
    for r in (0, 1):
        views = loaded[r].views
        assert set(views) == set(state)
        for k, v in state.items():
            assert torch.equal(views[k], v)
    with sidecar.client() as c:
        st = c.call("stats")
    # loaded: each rank's buffers count against its GPU; the offloaded copy is gone
    assert st["bytes_by_tier"] == {"device": 2 * nbytes(state), "host": 0, "disk": 0}
    with pytest.raises(StateError, match="disagree"):  # never zeros in place of the state
        ranks(2, lambda r, c: c.load("a", r, 2), sidecar)


def test_a_stranger_is_dropped_unread_and_a_missing_rank_is_named(tmp_path: Path) -> None:
    with StateSidecar(SidecarConfig(gpus=2, collective_timeout_s=1.0)) as sc:
        with pytest.raises(StateError, match="refused the token"):
            StateClient(sc.address, b"not the token" * 2, timeout_s=5)
        raw = socket.socket(socket.AF_UNIX)
        raw.connect(sc.address)
        with Connection(raw.detach()) as stranger:
            stranger.recv_bytes()  # the challenge
            stranger.send_bytes(b"\x00" * 64)  # no answer to it
            with contextlib.suppress(OSError):
                stranger.send_bytes(b"cos\nsystem\n(S'touch /tmp/pwned'\ntR.")  # never unpickled
        with sc.client() as c:
            with pytest.raises(StateError, match=r"ranks \[1\] never came"):
                c.offload("solo", 0, 2, 0, state_of("s", 2))
            with pytest.raises(StateError, match="unknown call"):
                c.call("transmogrify")
            with pytest.raises(StateError, match="unknown deployment"):
                c.call("prefetch", dep="nope")
        assert sc.alive
    assert not Path("/tmp/pwned").exists()


def test_the_token_never_crosses_the_wire_and_an_impostor_sidecar_is_caught(
    tmp_path: Path,
) -> None:
    """The sidecar's TCP listener is for trusted networks, and still: each side proves it
    knows the token with a MAC over the other's nonce, so an eavesdropper learns nothing
    to replay and a peer never talks to a sidecar that does not know its token."""
    import threading

    token = b"k" * 16
    with StateSidecar(SidecarConfig(gpus=1, tcp_host="127.0.0.1")) as sc:
        assert sc.tcp_address is not None
        with sc.client() as c:
            assert c.call("stats") is not None
    path = str(tmp_path / "fake.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)
    seen: list[bytes] = []

    def impostor() -> None:  # challenges, keeps the proof, answers with a proof of nothing
        sock, _ = listener.accept()
        with Connection(sock.detach()) as conn:
            conn.send_bytes(wire.encode(wire.Challenge(nonce=os.urandom(32))))
            seen.append(conn.recv_bytes())
            conn.send_bytes(wire.encode(wire.Proof(mac=b"\x00" * 32)))
            with contextlib.suppress(EOFError, OSError):
                conn.recv_bytes()

    t = threading.Thread(target=impostor)
    t.start()
    with pytest.raises(StateError, match="did not prove it knows the token"):
        StateClient(path, token, timeout_s=5)
    t.join(10)
    listener.close()
    assert seen and token not in seen[0]


def test_a_stopped_deployments_waiting_ranks_are_let_go(sidecar: StateSidecar) -> None:
    """Rank 0 of a deployment waits for rank 1, which is dead: `abandon` (the cluster service
    killed the group) ends rank 0's call at once, and new ranks of the same name gather and
    offload afresh."""
    state = state_of("p", 5)
    failed: list[BaseException] = []

    def waiting() -> None:
        try:
            with sidecar.client(timeout_s=60) as c:
                c.offload("p", 0, 2, 0, state)
        except StateError as exc:
            failed.append(exc)

    t = threading.Thread(target=waiting)
    t.start()
    with sidecar.client(timeout_s=60) as c:
        while c.call("abandon", dep="p") == 0:  # (until rank 0's call has arrived)
            time.sleep(0.01)
    t.join(30)
    assert not t.is_alive() and "its ranks were stopped" in str(failed[0])
    ranks(2, lambda r, c: c.offload("p", r, 2, r, state), sidecar)
    with sidecar.client() as c:
        assert c.call("stats")["deployments"]["p"]["loaded"] is False


def test_the_plan_decides_what_spills_and_prefetch_brings_it_up(sidecar: StateSidecar) -> None:
    """Host holds two deployments' state of three. With the plan [c, a, b] the one used last
    (b) spills to disk when c is offloaded; prefetching b brings it back, evicting by the plan."""
    states = {d: state_of(d, i) for i, d in enumerate("abc")}
    size = nbytes(states["a"])
    assert 2 * size <= 20 * KB < 3 * size
    with sidecar.client() as sched:
        for d in "ab":
            ranks(1, lambda r, c, d=d: c.offload(d, 0, 1, 0, states[d]), sidecar)
        sched.call("plan", upcoming=["c", "a", "b"])
        ranks(1, lambda r, c: c.offload("c", 0, 1, 1, states["c"]), sidecar)
        st = sched.call("stats")
        spilled = st["moved_bytes"].get("host->disk", 0)
        on_disk = {d: v["bytes"]["disk"] for d, v in st["deployments"].items()}
        assert on_disk == {"a": 0, "b": spilled, "c": 0} and spilled > 0  # only b, used last
        assert st["plan"] == ["c", "a", "b"]
        sched.call("plan", upcoming=["b", "a"])  # c runs no more; b is next
        assert sched.call("prefetch", dep="b") == spilled
        st = sched.call("stats")
        assert {d: v["bytes"]["disk"] for d, v in st["deployments"].items()} == {
            "a": 0,
            "b": 0,
            "c": spilled,  # c made room for b: it is never used again
        }
    views = ranks(1, lambda r, c: c.load("b", 0, 1), sidecar)[0].views
    assert all(torch.equal(views[k], v) for k, v in states["b"].items())


def test_without_a_plan_the_least_recently_used_spills(sidecar: StateSidecar) -> None:
    states = {d: state_of(d, i) for i, d in enumerate("abc")}
    for i, d in enumerate("abc"):
        ranks(1, lambda r, c, d=d, i=i: c.offload(d, 0, 1, i % 2, states[d]), sidecar)
    with sidecar.client() as c:
        st = c.call("stats")
    on_disk = {d: v["bytes"]["disk"] for d, v in st["deployments"].items()}
    assert on_disk["a"] > 0 and on_disk["b"] == on_disk["c"] == 0


def test_checkpoint_and_shards_come_from_offloaded_state(
    sidecar: StateSidecar, tmp_path: Path
) -> None:
    state = state_of("m", 3)
    ranks(1, lambda r, c: c.offload("m", 0, 1, 0, state, tier="disk", meta={"step": 7}), sidecar)
    with sidecar.client() as c:
        out = c.call("checkpoint", dep="m", path=str(tmp_path / "ck.pt"))
        assert out["tensors"] == len(state)
        saved = torch.load(tmp_path / "ck.pt")
        assert saved["__meta__"] == {"step": 7}
        for k, v in state.items():
            assert torch.equal(saved[f"{k.kind}/{k.name}"], v)
        specs = [
            ParamSpec(name="w0", shape=(32, 16), rule=ShardRule.COLUMN),
            ParamSpec(name="w1", shape=(32, 16), rule=ShardRule.ROW),
        ]
        total = 0
        for r in range(4):
            shards, fetched = c.call(
                "materialize", model="m", kind="weights", params=specs, tp=4, rank=r
            )
            total += fetched
            w = {k.name: v for k, v in state.items() if k.kind == "weights"}
            assert torch.equal(shards["w0"], w["w0"].chunk(4, 0)[r])
            assert torch.equal(shards["w1"], w["w1"].chunk(4, 1)[r])
        assert total == 2 * 32 * 16 * 2  # each byte of the two split weights fetched once


@pytest.mark.parametrize("over", ["unix", "tcp"])
def test_migration_mirrors_offloaded_state_to_another_nodes_sidecar(
    sidecar: StateSidecar, tmp_path: Path, over: str
) -> None:
    state = state_of("job", 4)
    ranks(2, lambda r, c: c.offload("job", r, 2, r, state, meta={"step": 3}), sidecar)
    with StateSidecar(SidecarConfig(gpus=2, tcp_host="127.0.0.1")) as other:
        to = other.address if over == "unix" else other.tcp_address
        assert to is not None
        with sidecar.client() as c:
            with pytest.raises(StateError, match="its own"):
                c.call("mirror", dep="job", to=sidecar.address, token=sidecar.token.hex())
            copied = c.call("mirror", dep="job", to=to, token=other.token.hex())
        assert copied == nbytes(state)
        loaded = ranks(2, lambda r, c: c.load("job", r, 2), other)
        for r in (0, 1):
            assert all(torch.equal(loaded[r].views[k], v) for k, v in state.items())
            assert loaded[r].meta == {"step": 3}  # the notes travel with the state
        with other.client() as c:
            assert c.call("stats")["deployments"]["job"]["loaded"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_sidecar_copies_through_cuda_ipc(tmp_path: Path) -> None:
    state = {k: v.cuda() for k, v in state_of("g", 5).items()}
    with StateSidecar(SidecarConfig(gpus=1, disk_dir=str(tmp_path))) as sc:
        ranks(1, lambda r, c: c.offload("g", 0, 1, 0, state), sc)
        with sc.client() as c:
            assert c.call("stats")["pinned_host"]
        views, read, _ = ranks(1, lambda r, c: c.load("g", 0, 1, device="cuda"), sc)[0]
        assert read == nbytes(state)
        for k, v in state.items():
            assert views[k].is_cuda and torch.equal(views[k], v)


def test_errors_cross_the_socket_as_their_kinds(sidecar: StateSidecar) -> None:
    """A refusal keeps its type over the socket (and is a StateError too, for callers that
    catch the sidecar's failures); an unknown call names the calls there are."""
    from loom.core.errors import NotFound, http_status
    from loom.state.errors import UnknownDeployment

    with sidecar.client() as c:
        with pytest.raises(StateError, match=r"unknown call 'transmogrify'.*'offload'"):
            c.call("transmogrify")
        with pytest.raises(NotFound, match="unknown deployment 'nobody'") as err:
            c.call("keys", dep="nobody", rank=0)
        assert type(err.value) is UnknownDeployment  # a caller catching the sidecar's failures
        assert http_status(err.value) == 404
