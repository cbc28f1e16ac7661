"""Pushing weights to a relay in fixed-size buckets and pulling them in large batches (ROSE
§4.2: 64 MB buckets pushed asynchronously by training ranks, ≥1 GB batches pulled on demand by
serving ranks), over any `WeightStore`.

Keys. A pusher writes one *stream* of named blobs (encoded parameters, in order) per version:
its bytes, concatenated, cut into buckets of exactly `bucket_bytes` (the last one shorter),
under `v{version}/{stream}/b{index:06d}`, and then its manifest under
`v{version}/{stream}/manifest` (JSON: each blob's name, offset and size in the stream). A
manifest is written only after every bucket is stored, so a stream is whole exactly when its
manifest exists. A stream name is a key path such as `dense`, `delta` or `dense/tp3` (one per
training rank pushing its own shards); its last segment is neither `manifest` nor a bucket's.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loom.runtime.relay.catchup import CatchUp, plan_catch_up
from loom.runtime.relay.errors import InvalidRequestError, ObjectMissingError, RelayError
from loom.runtime.relay.framing import joined
from loom.runtime.relay.store import Role, WeightStore, check_key, check_version

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

__all__ = [
    "BUCKET_BYTES",
    "PULL_BATCH_BYTES",
    "Entry",
    "Manifest",
    "Puller",
    "Pusher",
    "bucket_key",
    "manifest_key",
]

BUCKET_BYTES = 64 << 20  # ROSE §4.2, Appendix F: 64 MB buckets
PULL_BATCH_BYTES = 1 << 30  # ROSE §4.2: serving ranks pull ≥1 GB at a time
_RESERVED = re.compile(r"manifest|b\d{6}")
_MANIFEST = re.compile(r"v(\d+)/(.+)/manifest")


def check_stream(stream: str) -> str:
    check_key(stream)
    if _RESERVED.fullmatch(stream.rsplit("/", 1)[-1]):
        raise InvalidRequestError(f"stream {stream!r} ends like a bucket or a manifest key")
    return stream


def bucket_key(version: int, stream: str, index: int) -> str:
    return f"v{version}/{stream}/b{index:06d}"


def manifest_key(version: int, stream: str) -> str:
    return f"v{version}/{stream}/manifest"


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    offset: int  # in the stream
    size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    version: int
    stream: str
    bucket_bytes: int
    size: int  # bytes of the whole stream
    entries: tuple[Entry, ...]

    @property
    def buckets(self) -> int:
        return -(-self.size // self.bucket_bytes)

    def bucket_size(self, index: int) -> int:
        return min(self.bucket_bytes, self.size - index * self.bucket_bytes)

    def bucket_keys(self) -> list[str]:
        return [bucket_key(self.version, self.stream, i) for i in range(self.buckets)]

    def encode(self) -> bytes:
        body = {
            "version": self.version,
            "stream": self.stream,
            "bucket_bytes": self.bucket_bytes,
            "size": self.size,
            "entries": [[e.name, e.offset, e.size] for e in self.entries],
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Manifest:
        try:
            body = json.loads(raw)
            return cls(
                version=body["version"],
                stream=body["stream"],
                bucket_bytes=body["bucket_bytes"],
                size=body["size"],
                entries=tuple(Entry(n, o, s) for n, o, s in body["entries"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise RelayError(f"unreadable manifest: {exc}") from None


def _buckets(
    blobs: Iterable[tuple[str, Buffer]], size: int, entries: list[Entry]
) -> Iterator[bytes]:
    """The stream's bytes cut into buckets of `size` (each byte copied once at most: a blob
    that is a whole bucket goes as it is); `entries` gets each blob's place as it goes."""
    parts: list[memoryview] = []
    filled = offset = 0
    for name, blob in blobs:
        view = memoryview(blob).cast("B")  # any buffer (an array's too), as bytes
        entries.append(Entry(name, offset, view.nbytes))
        offset += view.nbytes
        while view:
            take = min(size - filled, len(view))
            parts.append(view[:take])
            filled += take
            view = view[take:]
            if filled == size:
                yield joined(parts)
                parts, filled = [], 0
    if parts:
        yield joined(parts)


class Pusher:
    """Pushes streams into `store` by buckets, `workers` puts in flight at once (and at most
    `2 * workers` buckets held in memory). With `member_id` it joins as a training member
    publishing the version it pushes, so the relay keeps the last whole version meanwhile."""

    def __init__(
        self,
        store: WeightStore,
        *,
        bucket_bytes: int = BUCKET_BYTES,
        workers: int = 4,
        member_id: str | None = None,
    ) -> None:
        if bucket_bytes < 1 or workers < 1:
            raise InvalidRequestError("bucket_bytes and workers must be positive")
        self.store = store
        self.bucket_bytes = bucket_bytes
        self.workers = workers
        self.member_id = member_id

    def push(self, version: int, stream: str, blobs: Iterable[tuple[str, Buffer]]) -> Manifest:
        """Every bucket, then the manifest; the store's first refusal is raised and the
        manifest is not written (the stream stays incomplete; pushing it again is safe)."""
        check_version(version)
        check_stream(stream)
        if self.member_id is not None:
            self.store.join(self.member_id, Role.TRAIN, version)
        entries: list[Entry] = []
        with ThreadPoolExecutor(self.workers, thread_name_prefix="relay-push") as pool:
            inflight: set[Future[object]] = set()
            try:
                for index, bucket in enumerate(_buckets(blobs, self.bucket_bytes, entries)):
                    if len(inflight) >= 2 * self.workers:
                        done, inflight = wait(inflight, return_when=FIRST_COMPLETED)
                        for f in done:
                            f.result()
                    key = bucket_key(version, stream, index)
                    inflight.add(pool.submit(self.store.put, key, bucket, version))
                for f in inflight:
                    f.result()
            finally:
                for f in inflight:
                    f.cancel()
        size = sum(e.size for e in entries)
        manifest = Manifest(
            version=version,
            stream=stream,
            bucket_bytes=self.bucket_bytes,
            size=size,
            entries=tuple(entries),
        )
        self.store.put(manifest_key(version, stream), manifest.encode(), version)
        return manifest


class _Cutter:
    """Cuts a stream, fed bucket by bucket, back into the blobs its manifest lists."""

    def __init__(self, entries: Sequence[Entry]) -> None:
        self._entries = iter(entries)
        self._entry: Entry | None = None
        self._offset = 0  # where the next blob starts
        self._left = 0  # bytes of the current blob still to come
        self._parts: list[memoryview] = []
        self._advance()

    def _advance(self) -> None:
        self._entry = next(self._entries, None)
        if self._entry is not None:
            if self._entry.offset != self._offset:
                raise RelayError(f"manifest lists {self._entry.name!r} out of place")
            self._offset += self._entry.size
            self._left = self._entry.size

    def _whole(self) -> Iterator[tuple[str, bytes]]:
        while self._entry is not None and not self._left:
            parts, self._parts = self._parts, []
            yield self._entry.name, joined(parts)
            self._advance()

    def feed(self, bucket: bytes) -> Iterator[tuple[str, bytes]]:
        view = memoryview(bucket)
        yield from self._whole()
        while view and self._entry is not None:
            take = min(self._left, len(view))
            self._parts.append(view[:take])
            self._left -= take
            view = view[take:]
            yield from self._whole()
        if view:
            raise RelayError("the stream holds more bytes than its manifest lists")

    def finish(self) -> Iterator[tuple[str, bytes]]:
        yield from self._whole()
        if self._entry is not None:
            raise RelayError(f"the stream ends inside {self._entry.name!r}")


class Puller:
    """Pulls whole streams from `store` in batches of at least `batch_bytes` (one `get_many`
    each), without coordinating with pushers or other pullers."""

    def __init__(self, store: WeightStore, *, batch_bytes: int = PULL_BATCH_BYTES) -> None:
        if batch_bytes < 1:
            raise InvalidRequestError("batch_bytes must be positive")
        self.store = store
        self.batch_bytes = batch_bytes

    def manifest(self, version: int, stream: str) -> Manifest:
        """The stream's manifest (`ObjectMissingError` while the stream is not whole)."""
        return Manifest.decode(self.store.get(manifest_key(version, check_stream(stream))))

    def wait_manifest(
        self, version: int, stream: str, timeout_s: float, poll_s: float = 0.05
    ) -> Manifest:
        """The manifest once the stream is whole; `TimeoutError` after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.manifest(version, stream)
            except ObjectMissingError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"stream {stream!r} of version {version} not whole after {timeout_s} s"
                    ) from None
                time.sleep(poll_s)

    def batches(self, manifest: Manifest) -> list[list[str]]:
        """Bucket keys in order, grouped so that each batch but the last holds at least
        `batch_bytes`."""
        out: list[list[str]] = []
        current: list[str] = []
        filled = 0
        for i, key in enumerate(manifest.bucket_keys()):
            current.append(key)
            filled += manifest.bucket_size(i)
            if filled >= self.batch_bytes:
                out.append(current)
                current, filled = [], 0
        if current:
            out.append(current)
        return out

    def iter_pull(self, manifest: Manifest) -> Iterator[tuple[str, bytes]]:
        """Each blob (name, bytes) in stream order, as soon as its batch has come; a blob is
        joined once from views of its buckets (a blob that is a whole bucket, not copied)."""
        cutter = _Cutter(manifest.entries)
        index = 0
        for batch in self.batches(manifest):
            got = self.store.get_many(batch)
            for key in batch:
                bucket = got.pop(key)
                if len(bucket) != manifest.bucket_size(index):
                    raise RelayError(f"bucket {key!r} holds {len(bucket)} bytes, not as listed")
                index += 1
                yield from cutter.feed(bucket)
        yield from cutter.finish()

    def pull(self, version: int, stream: str) -> dict[str, bytes]:
        """Every blob of a whole stream, by name."""
        return dict(self.iter_pull(self.manifest(version, stream)))

    def complete(self) -> dict[int, set[str]]:
        """The streams stored whole (their manifest exists), by version."""
        out: dict[int, set[str]] = {}
        for info in self.store.list(prefix="v"):
            match = _MANIFEST.fullmatch(info.key)
            if match is not None:
                out.setdefault(int(match.group(1)), set()).add(match.group(2))
        return out

    def catch_up(self, held: int | None, *, dense: str = "dense", delta: str = "delta") -> CatchUp:
        """What a member holding `held` should pull next (see `plan_catch_up`)."""
        return plan_catch_up(held, self.complete(), dense=dense, delta=delta)
