"""A model's versions through a weight store: the trainer's deltas and dense copies, a follower
catching up bit for bit by deltas or from a dense version, exactly to the version asked, and
what it cannot reach refused with the reason."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from loom.core.errors import ConfigError  # noqa: E402
from loom.runtime.relay import InMemoryStore  # noqa: E402
from loom.runtime.relay.catchup import CatchUpKind  # noqa: E402
from loom.runtime.relay.model_sync import WeightFollower, WeightPublisher  # noqa: E402

pytestmark = pytest.mark.torch


def weights(seed: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(64, 16, generator=gen).to(dtype),
        "layer.0.w": torch.randn(16, 16, generator=gen).to(dtype),
        "norm.weight": torch.ones(16, dtype=dtype),
    }


def step(w: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
    """A training step that touches a few embedding rows and the layer's weight."""
    out = {n: t.clone() for n, t in w.items()}
    out["embed.weight"][rows] += 1e-3
    out["layer.0.w"] *= 1.0001
    return out


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[n].dtype == b[n].dtype and torch.equal(a[n].view(-1).view(torch.uint8),
                                                b[n].view(-1).view(torch.uint8))
        for n in a
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_followers_track_every_version_bit_for_bit(dtype: torch.dtype) -> None:
    store = InMemoryStore(1 << 30)
    pub = WeightPublisher(store)
    early, late = WeightFollower(store, member_id="e0"), WeightFollower(store, member_id="e1")
    w = weights(0, dtype)
    first = pub.publish(0, w)
    assert first.streams == ("dense",) and first.changed == first.numel
    got = early.catch_up(0)
    assert got.kind is CatchUpKind.DENSE and same(early.tensors, w)
    for v in range(1, 4):
        w = step(w, slice(v, v + 2))
        p = pub.publish(v, w)
        # a delta: the two embedding rows and the layer's weight, not the norm
        assert p.streams == ("delta",) and p.bytes < p.dense_bytes
        assert p.changed <= 2 * 16 + 16 * 16
        got = early.catch_up(v)
        assert got.kind is CatchUpKind.DELTA and got.steps == ((v, "delta"),)
        assert "norm.weight" not in got.changed and same(early.tensors, w)
    assert pub.publish(3, w).streams == ()  # the same version again: nothing to push
    # the store kept what its members need: one that joins late finds no dense version
    with pytest.raises(ConfigError, match="e1 has nothing to load"):
        late.catch_up()
    w = step(w, slice(0, 1))
    pub.dense_every = 2
    assert pub.publish(4, w).streams == ("delta", "dense")
    w = step(w, slice(5, 6))
    pub.publish(5, w)
    got = late.catch_up()  # the dense version 4, then the delta of 5
    assert got.kind is CatchUpKind.DENSE and got.steps == ((4, "dense"), (5, "delta"))
    assert got.version == 5 and same(late.tensors, w)
    assert early.catch_up().steps == ((4, "delta"), (5, "delta"))


def test_a_follower_reaches_exactly_the_version_asked_or_says_why() -> None:
    store = InMemoryStore(1 << 30)
    pub = WeightPublisher(store, dense_every=2)
    f = WeightFollower(store, member_id="e0")
    w = weights(1)
    history = []
    for v in range(4):
        w = step(w, slice(v, v + 1))
        history.append(w)
        want = ("dense",) if v == 0 else ("delta", "dense") if v % 2 == 0 else ("delta",)
        assert pub.publish(v, w).streams == want
        if v == 0:
            assert f.catch_up(0).version == 0  # (the store keeps what it will need from here)
    assert f.catch_up(1).version == 1 and same(f.tensors, history[1])
    with pytest.raises(ConfigError, match="cannot reach version 7 from 1"):
        f.catch_up(7)
    assert f.catch_up(3).version == 3 and same(f.tensors, history[3])
    pub.publish(5, step(w, slice(9, 10)))  # a gap: version 5 goes dense only
    assert pub.version == 5 and f.catch_up(5).kind is CatchUpKind.DENSE
    with pytest.raises(ConfigError, match="older than 5"):
        pub.publish(4, w)


def test_a_new_shape_goes_dense() -> None:
    store = InMemoryStore(1 << 30)
    pub = WeightPublisher(store)
    pub.publish(0, weights(2))
    grown = weights(2) | {"extra": torch.zeros(3)}
    assert pub.publish(1, grown).streams == ("dense",)
    f = WeightFollower(store, member_id="e0")
    assert f.catch_up(1).kind is CatchUpKind.DENSE and same(f.tensors, grown)
