"""A weight store in this process's memory, thread-safe, under a memory cap: a put past the
cap is refused whole (`StoreFullError`), never stored in part or made room for by dropping."""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from loom.runtime.relay import retention
from loom.runtime.relay.errors import (
    InvalidRequestError,
    ObjectMissingError,
    StoreFullError,
    UnknownMemberError,
    UnknownVersionError,
    VersionConflictError,
    VersionNeededError,
)
from loom.runtime.relay.store import (
    Member,
    ObjectInfo,
    Role,
    VersionInfo,
    check_key,
    check_member_id,
    check_version,
)

__all__ = ["InMemoryStore", "StoreStats"]

log = logging.getLogger(__name__)

_MISSING_SHOWN = 5  # missing keys a batch error names


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreStats:
    bytes: int  # stored
    max_bytes: int
    objects: int
    versions: int
    members: int
    dropped: int  # versions dropped since the store began


@dataclass(frozen=True, slots=True)
class _Object:
    data: bytes
    version: int


class InMemoryStore:
    """`WeightStore` over a dict. `member_ttl_s`: a member not heard from (joined again) for
    this long is gone (None: members stay until they leave). `auto_collect`: drop unneeded
    versions whenever membership changes. `clock` is injected for tests."""

    def __init__(
        self,
        max_bytes: int,
        *,
        member_ttl_s: float | None = None,
        auto_collect: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_bytes < 1:
            raise InvalidRequestError(f"max_bytes must be positive, not {max_bytes}")
        if member_ttl_s is not None and member_ttl_s <= 0:
            raise InvalidRequestError(f"member_ttl_s must be positive, not {member_ttl_s}")
        self.max_bytes = max_bytes
        self.member_ttl_s = member_ttl_s
        self.auto_collect = auto_collect
        self._clock = clock
        self._lock = threading.Lock()
        self._objects: dict[str, _Object] = {}
        self._by_version: dict[int, dict[str, int]] = {}  # version -> key -> size
        self._bytes = 0
        self._members: dict[str, Member] = {}
        self._heard: dict[str, float] = {}
        self._dropped = 0

    # -- objects ---------------------------------------------------------------------------

    def admit(self, key: str, version: int, size: int) -> None:
        """Raise now what `put(key, <size bytes>, version)` would raise now: the relay asks
        before it reads a body (`put` still decides: room is not reserved)."""
        check_key(key)
        check_version(version)
        with self._lock:
            self._check_put(key, version, size)

    def _check_put(self, key: str, version: int, size: int) -> _Object | None:
        """The object `key` holds, if `size` bytes at `version` may replace it or be added."""
        old = self._objects.get(key)
        if old is not None and old.version != version:
            raise VersionConflictError(
                f"{key!r} is stored at version {old.version}, not {version}: delete it first"
            )
        after = self._bytes - (len(old.data) if old else 0) + size
        if after > self.max_bytes:
            raise StoreFullError(
                f"storing {size} bytes under {key!r} would hold {after} bytes, over the cap of "
                f"{self.max_bytes} ({self._bytes} stored): drop old versions or raise --max-bytes"
            )
        return old

    def put(self, key: str, data: bytes, version: int) -> ObjectInfo:
        check_key(key)
        check_version(version)
        if not isinstance(data, bytes):
            data = bytes(data)  # a buffer the caller might change later
        with self._lock:
            if self._check_put(key, version, len(data)) is not None:
                self._forget(key)
            self._objects[key] = _Object(data, version)
            self._by_version.setdefault(version, {})[key] = len(data)
            self._bytes += len(data)
        return ObjectInfo(key=key, version=version, size=len(data))

    def get(self, key: str) -> bytes:
        return self.get_with_version(key)[0]

    def get_with_version(self, key: str) -> tuple[bytes, int]:
        check_key(key)
        with self._lock:
            obj = self._objects.get(key)
        if obj is None:
            raise ObjectMissingError(f"no object {key!r}")
        return obj.data, obj.version

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        return {k: data for k, (data, _) in self.get_many_with_versions(keys).items()}

    def get_many_with_versions(self, keys: Sequence[str]) -> dict[str, tuple[bytes, int]]:
        for key in keys:
            check_key(key)
        if len(set(keys)) != len(keys):
            raise InvalidRequestError("a batch asks for a key twice")
        with self._lock:
            found = {k: self._objects.get(k) for k in keys}
        missing = [k for k, obj in found.items() if obj is None]
        if missing:
            shown = ", ".join(map(repr, missing[:_MISSING_SHOWN]))
            more = (
                f" and {len(missing) - _MISSING_SHOWN} more"
                if len(missing) > _MISSING_SHOWN
                else ""
            )
            raise ObjectMissingError(f"no object {shown}{more}")
        return {k: (obj.data, obj.version) for k, obj in found.items() if obj is not None}

    def delete(self, key: str) -> ObjectInfo:
        check_key(key)
        with self._lock:
            obj = self._objects.get(key)
            if obj is None:
                raise ObjectMissingError(f"no object {key!r}")
            self._forget(key)
        return ObjectInfo(key=key, version=obj.version, size=len(obj.data))

    def _forget(self, key: str) -> None:
        obj = self._objects.pop(key)
        keys = self._by_version[obj.version]
        del keys[key]
        if not keys:
            del self._by_version[obj.version]
        self._bytes -= len(obj.data)

    def list(self, version: int | None = None, prefix: str = "") -> builtins.list[ObjectInfo]:
        if version is not None:
            check_version(version)
        if not isinstance(prefix, str):
            raise InvalidRequestError("a prefix is a string")
        with self._lock:
            if version is None:
                items = [(k, o.version, len(o.data)) for k, o in self._objects.items()]
            else:
                sizes = self._by_version.get(version, {})
                items = [(k, version, size) for k, size in sizes.items()]
        return [
            ObjectInfo(key=k, version=v, size=size)
            for k, v, size in sorted(items)
            if k.startswith(prefix)
        ]

    # -- versions --------------------------------------------------------------------------

    def versions(self) -> builtins.list[VersionInfo]:
        with self._lock:
            self._expire()
            present = sorted(self._by_version)
            lowest = retention.floor(present, self._members.values())
            return [
                VersionInfo(
                    version=v,
                    objects=len(self._by_version[v]),
                    size=sum(self._by_version[v].values()),
                    needed=lowest is not None and v >= lowest,
                )
                for v in present
            ]

    def drop_version(self, version: int) -> VersionInfo:
        check_version(version)
        with self._lock:
            self._expire()
            if version not in self._by_version:
                raise UnknownVersionError(f"no object of version {version} is stored")
            present = sorted(self._by_version)
            lowest = retention.floor(present, self._members.values())
            if lowest is not None and version >= lowest:
                why = "; ".join(retention.needed_by(version, present, self._members.values()))
                raise VersionNeededError(f"version {version} is still needed: {why}")
            return self._drop(version)

    def collect(self) -> builtins.list[int]:
        with self._lock:
            self._expire()
            return self._collect()

    def _collect(self) -> builtins.list[int]:
        present = sorted(self._by_version)
        lowest = retention.floor(present, self._members.values())
        dropped = [v for v in present if lowest is not None and v < lowest]
        for v in dropped:
            self._drop(v)
        if dropped:
            log.info("dropped versions %s (floor %s)", dropped, lowest)
        return dropped

    def _drop(self, version: int) -> VersionInfo:
        sizes = self._by_version.pop(version)
        for key in sizes:
            del self._objects[key]
        freed = sum(sizes.values())
        self._bytes -= freed
        self._dropped += 1
        return VersionInfo(version=version, objects=len(sizes), size=freed, needed=False)

    # -- members ---------------------------------------------------------------------------

    def join(self, member_id: str, role: Role = Role.SERVE, version: int | None = None) -> Member:
        check_member_id(member_id)
        try:
            role = Role(role)
        except ValueError:
            raise InvalidRequestError(f"bad role {role!r}: train or serve") from None
        if version is not None:
            check_version(version)
        member = Member(member_id=member_id, role=role, version=version)
        with self._lock:
            self._expire()
            self._members[member_id] = member
            self._heard[member_id] = self._clock()
            if self.auto_collect:
                self._collect()
        return member

    def leave(self, member_id: str) -> Member:
        check_member_id(member_id)
        with self._lock:
            self._expire()
            member = self._members.pop(member_id, None)
            if member is None:
                raise UnknownMemberError(f"no live member {member_id!r}")
            del self._heard[member_id]
            if self.auto_collect:
                self._collect()
        return member

    def members(self) -> builtins.list[Member]:
        with self._lock:
            self._expire()
            return [self._members[m] for m in sorted(self._members)]

    def _expire(self) -> None:
        if self.member_ttl_s is None:
            return
        now = self._clock()
        gone = [m for m, t in self._heard.items() if now - t > self.member_ttl_s]
        for m in gone:
            del self._members[m], self._heard[m]
        if gone:
            log.info("members %s expired (not heard from in %s s)", gone, self.member_ttl_s)
            if self.auto_collect:
                self._collect()

    # -- accounting ------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        with self._lock:
            self._expire()
            return StoreStats(
                bytes=self._bytes,
                max_bytes=self.max_bytes,
                objects=len(self._objects),
                versions=len(self._by_version),
                members=len(self._members),
                dropped=self._dropped,
            )
