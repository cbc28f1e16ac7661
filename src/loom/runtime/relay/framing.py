"""The body of a batch pull (`POST /v1/objects:batch`): many objects in one response.

    8 bytes   the index's length N, an unsigned big-endian integer
    N bytes   the index, UTF-8 JSON: {"objects": [{"key": K, "version": V, "size": S}, ...]}
    ...       the objects' bytes, concatenated in the index's order (sum of S bytes)

The response's Content-Length is the whole, so a reader knows a body cut short. A single
object's GET answers its raw bytes, with its version in the `X-Loom-Version` header."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence

from loom.core.errors import InvalidRequest
from loom.runtime.relay.store import ObjectInfo

__all__ = [
    "MEDIA_TYPE",
    "VERSION_HEADER",
    "BatchDecoder",
    "FramingError",
    "encode_index",
    "frames",
    "joined",
]

MEDIA_TYPE = "application/x-loom-relay-batch"
VERSION_HEADER = "X-Loom-Version"
_LENGTH = struct.Struct(">Q")
_MAX_INDEX = 64 << 20


class FramingError(InvalidRequest):
    """A batch body that does not follow the format (cut short, or not a batch at all): bad
    input (400) on the relay, a ValueError for whoever decodes it."""


def encode_index(infos: Sequence[ObjectInfo]) -> bytes:
    """The length prefix and the index."""
    index = json.dumps({"objects": [i.to_json() for i in infos]}, separators=(",", ":"))
    raw = index.encode()
    return _LENGTH.pack(len(raw)) + raw


def frames(objects: Sequence[tuple[ObjectInfo, bytes]]) -> tuple[int, Iterator[bytes]]:
    """The body's length and its pieces (the index, then each object's bytes, uncopied)."""
    head = encode_index([info for info, _ in objects])

    def pieces() -> Iterator[bytes]:
        yield head
        for _, data in objects:
            if data:
                yield data

    return len(head) + sum(info.size for info, _ in objects), pieces()


class BatchDecoder:
    """Reads a batch body fed in chunks of any size: `feed` each, then `finish`. Each object's
    bytes are joined once from views of the chunks (no other copy)."""

    def __init__(self) -> None:
        self._head = bytearray()
        self._index: list[ObjectInfo] | None = None
        self._done: dict[str, tuple[bytes, int]] = {}
        self._parts: list[memoryview] = []  # of the object being read
        self._left = 0  # its bytes still to come

    def feed(self, chunk: bytes) -> None:
        """The next piece of the body (kept by reference until its objects are whole)."""
        view = memoryview(chunk if isinstance(chunk, bytes) else bytes(chunk))
        while view:
            view = self._read_index(view) if self._index is None else self._read_payload(view)

    def _read_index(self, view: memoryview) -> memoryview:
        need = _LENGTH.size
        if len(self._head) >= need:
            need += _LENGTH.unpack_from(self._head)[0]
            if need > _LENGTH.size + _MAX_INDEX:
                raise FramingError("batch index too long: not a batch body")
        take = min(need - len(self._head), len(view))
        self._head += view[:take]
        if len(self._head) == need and need > _LENGTH.size:
            self._index = self._parse_index(bytes(self._head[_LENGTH.size :]))
            self._start_next()
        return view[take:]

    @staticmethod
    def _parse_index(raw: bytes) -> list[ObjectInfo]:
        try:
            entries = json.loads(raw)["objects"]
            return [ObjectInfo(key=e["key"], version=e["version"], size=e["size"]) for e in entries]
        except (ValueError, KeyError, TypeError) as exc:
            raise FramingError(f"unreadable batch index: {exc}") from None

    def _start_next(self) -> None:
        """Past the objects of no bytes, to the next one to read (if any)."""
        assert self._index is not None
        while len(self._done) < len(self._index):
            info = self._index[len(self._done)]
            if info.size:
                self._left = info.size
                return
            self._done[info.key] = (b"", info.version)

    def _read_payload(self, view: memoryview) -> memoryview:
        assert self._index is not None
        if len(self._done) == len(self._index):
            raise FramingError("batch body longer than its index says")
        take = min(self._left, len(view))
        self._parts.append(view[:take])
        self._left -= take
        if not self._left:
            info = self._index[len(self._done)]
            parts, self._parts = self._parts, []
            data = joined(parts)
            self._done[info.key] = (data, info.version)
            self._start_next()
        return view[take:]

    def finish(self) -> dict[str, tuple[bytes, int]]:
        """Every object (key -> bytes, version), in the index's order; `FramingError` if the
        body stopped short."""
        if self._index is None or len(self._done) < len(self._index):
            got = "no index" if self._index is None else f"{len(self._done)}/{len(self._index)}"
            raise FramingError(f"batch body cut short ({got} objects whole)")
        return self._done


def joined(parts: list[memoryview]) -> bytes:
    """The bytes of `parts`: the underlying object itself when one part is all of it."""
    if len(parts) == 1:
        obj = parts[0].obj
        if isinstance(obj, bytes) and len(obj) == parts[0].nbytes:
            return obj
    return b"".join(parts)
