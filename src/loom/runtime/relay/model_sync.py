"""A model's weights as versions in a weight store (ROSE §4.2): the trainer publishes each
version as sparse deltas against the one before (the `delta` stream; the whole tensor where
more than `DENSE_THRESHOLD` of it changed) and, when it must, as a dense copy (the `dense`
stream); a follower — an inference engine — catches up from the version it holds by the
relay's plan (`plan_catch_up`): the deltas after its version, or a dense version and the deltas
after that.

Both sides keep a host copy of the weights at the last version they published or loaded: the
publisher to diff against, the follower to apply deltas to. The codec carries each tensor's
own type (bf16 or float32, bit for bit).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loom.core.errors import ConfigError
from loom.runtime.relay.catchup import CatchUpKind, plan_catch_up
from loom.runtime.relay.store import Role, WeightStore
from loom.runtime.relay.transfer import BUCKET_BYTES, Puller, Pusher
from loom.state.weights.codec import DENSE_THRESHOLD, Encoding, apply, decode, encode, read_header

__all__ = ["DELTA", "DENSE", "Followed", "Published", "WeightFollower", "WeightPublisher"]

DENSE, DELTA = "dense", "delta"


@dataclass(frozen=True, kw_only=True)
class Published:
    version: int
    streams: tuple[str, ...]  # what was pushed: "delta", "dense", both, or nothing (no change)
    bytes: int  # bytes pushed (the blobs of every stream)
    dense_bytes: int  # what one dense copy of the weights is, for comparison
    changed: int  # elements whose bits changed since the version before (all, without one)
    numel: int  # elements of the weights
    seconds: float


@dataclass(frozen=True, kw_only=True)
class Followed:
    version: int | None  # the version held now
    kind: CatchUpKind  # current, delta, dense (or none: nothing to load)
    steps: tuple[tuple[int, str], ...]  # (version, stream) pulled and applied, in order
    changed: frozenset[str]  # tensors whose bits changed
    bytes: int  # bytes pulled
    seconds: float


def _host_copy(t: Any) -> Any:
    """A CPU copy of tensor `t`, detached, contiguous."""
    return t.detach().to("cpu", copy=True).contiguous()


class WeightPublisher:
    """Publishes versions of named tensors into `store` as training member `member_id`.
    A version right after the last one published goes as a delta; the first, one after a gap,
    one whose tensors differ in names or shapes, and every `dense_every`-th also go dense."""

    def __init__(
        self,
        store: WeightStore,
        *,
        member_id: str = "trainer",
        dense_every: int = 0,
        bucket_bytes: int = BUCKET_BYTES,
        dense_threshold: float = DENSE_THRESHOLD,
    ) -> None:
        if dense_every < 0:
            raise ConfigError(f"dense_every must be >= 0, got {dense_every}")
        self.store, self.member_id = store, member_id
        self.dense_every, self.dense_threshold = dense_every, dense_threshold
        self.pusher = Pusher(store, bucket_bytes=bucket_bytes, member_id=member_id)
        self.version: int | None = None
        self._held: dict[str, Any] = {}  # host copies at `version`

    def publish(self, version: int, tensors: Mapping[str, Any]) -> Published:
        """Push `tensors` as `version` (nothing when it is the version published last)."""
        t0 = time.perf_counter()
        if self.version is not None and version < self.version:
            raise ConfigError(f"version {version} is older than {self.version}, published")
        new = {name: _host_copy(t) for name, t in sorted(tensors.items())}
        numel = sum(t.numel() for t in new.values())
        dense_bytes = sum(t.numel() * t.element_size() for t in new.values())
        if version == self.version:
            return Published(
                version=version, streams=(), bytes=0, dense_bytes=dense_bytes, changed=0,
                numel=numel, seconds=time.perf_counter() - t0,
            )  # fmt: skip
        same = self._held.keys() == new.keys() and all(
            self._held[n].shape == t.shape and self._held[n].dtype == t.dtype
            for n, t in new.items()
        )
        delta = same and self.version is not None and version == self.version + 1
        dense = not delta or (self.dense_every > 0 and version % self.dense_every == 0)
        pushed, changed, streams = 0, numel, []
        if delta:
            blobs = [
                (n, encode(t, old=self._held[n], version=version, base_version=self.version,
                           dense_threshold=self.dense_threshold))
                for n, t in new.items()
            ]  # fmt: skip
            changed = sum(_changed(blob) for _, blob in blobs)
            self.pusher.push(version, DELTA, blobs)
            pushed += sum(len(b) for _, b in blobs)
            streams.append(DELTA)
        if dense:
            blobs = [(n, encode(t, version=version)) for n, t in new.items()]
            self.pusher.push(version, DENSE, blobs)
            pushed += sum(len(b) for _, b in blobs)
            streams.append(DENSE)
        self.version, self._held = version, new
        return Published(
            version=version, streams=tuple(streams), bytes=pushed, dense_bytes=dense_bytes,
            changed=changed, numel=numel, seconds=time.perf_counter() - t0,
        )  # fmt: skip


def _changed(blob: bytearray) -> int:
    head = read_header(blob)
    return head.numel if head.encoding is Encoding.DENSE else head.nnz


class WeightFollower:
    """Follows the versions in `store` as serving member `member_id`: `tensors` holds host
    copies of every tensor at `version` (torch tensors, each of the type it was published
    in)."""

    def __init__(self, store: WeightStore, *, member_id: str) -> None:
        self.store, self.member_id = store, member_id
        self.puller = Puller(store)
        self.version: int | None = None
        self.tensors: dict[str, Any] = {}

    def catch_up(self, target: int | None = None) -> Followed:
        """Reach `target` (the newest whole version when None) by the fewest dense pulls;
        `ConfigError` if no stored version gets there. Then tell the store the version held,
        so that it keeps what this member will need next."""
        t0 = time.perf_counter()
        complete = self.puller.complete()
        if target is not None:
            complete = {v: s for v, s in complete.items() if v <= target}
        plan = plan_catch_up(self.version, complete, dense=DENSE, delta=DELTA)
        if plan.kind is CatchUpKind.NONE and self.version is None:
            raise ConfigError(f"{self.member_id} has nothing to load: {plan.reason}")
        if target is not None and plan.target != target:
            raise ConfigError(
                f"{self.member_id} cannot reach version {target} from {self.version}: {plan.reason}"
            )
        changed: set[str] = set()
        pulled = 0
        for version, stream in plan.steps:
            blobs = self.puller.pull(version, stream)
            pulled += sum(len(b) for b in blobs.values())
            if stream == DENSE:
                self.tensors = {n: decode(b, backend="torch") for n, b in blobs.items()}
                changed = set(self.tensors)
            else:
                if blobs.keys() != self.tensors.keys():
                    raise ConfigError(f"the delta of version {version} names other tensors")
                for name, blob in blobs.items():
                    if read_header(blob).nnz:
                        apply(blob, self.tensors[name], current_version=self.version, inplace=True)
                        changed.add(name)
            self.version = version
        if plan.steps:
            self.store.join(self.member_id, Role.SERVE, self.version)
        return Followed(
            version=self.version, kind=plan.kind, steps=plan.steps, changed=frozenset(changed),
            bytes=pulled, seconds=time.perf_counter() - t0,
        )  # fmt: skip
