"""The weight store interface (ROSE §4.2's relay): training ranks put versioned objects,
serving ranks get them one by one or in large batches, and members join and leave freely;
versions nobody may still need are dropped. The in-memory store, the relay's HTTP client and,
later, an RDMA store (Mooncake's) implement it.

Objects. A key is a URL-safe path: segments of letters, digits, `.`, `_` and `-` joined by
`/` (no empty, `.` or `..` segment), at most `MAX_KEY_CHARS` characters. Every object has a
version (an integer, 0 to 2**63-1). Putting a key again under the same version replaces its
bytes (a retried push succeeds); under another version it is a `VersionConflictError`: objects
never change version. A put either stores the whole object or nothing.

Members. A member is a training rank (`Role.TRAIN`, `version`: the version it is publishing)
or a serving rank (`Role.SERVE`, `version`: the version whose weights it holds, None before its
first pull). Joining again updates a member (and is its heartbeat where members expire).

Retention (`retention.floor`): the store keeps every version at or above the floor and may drop
the rest. The floor is the newest version stored, lowered to `h + 1` for each serving member
holding `h` (the deltas that bring it to the newest) and to the newest version below `p` for
each training member publishing `p` (the last complete one, for members that join while `p` is
in flight). `drop_version` refuses a version at or above it; `collect` drops all below it.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from loom.runtime.relay.errors import InvalidRequestError

__all__ = [
    "MAX_KEY_CHARS",
    "MAX_VERSION",
    "Member",
    "ObjectInfo",
    "Role",
    "VersionInfo",
    "WeightStore",
    "check_key",
    "check_member_id",
    "check_version",
]

MAX_KEY_CHARS = 512
MAX_VERSION = 2**63 - 1
_SEGMENT = r"[A-Za-z0-9_.-]+"
_KEY = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*")
_MEMBER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class Role(StrEnum):
    """What a member does: publish weights (train) or pull them (serve)."""

    TRAIN = "train"
    SERVE = "serve"


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectInfo:
    key: str
    version: int
    size: int  # bytes

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "version": self.version, "size": self.size}


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionInfo:
    version: int
    objects: int
    size: int  # bytes of its objects
    needed: bool  # at or above the retention floor: some live member may still need it

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "objects": self.objects,
            "size": self.size,
            "needed": self.needed,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    member_id: str
    role: Role
    version: int | None  # train: the version it publishes; serve: the one it holds

    def to_json(self) -> dict[str, Any]:
        return {"member_id": self.member_id, "role": self.role.value, "version": self.version}


def check_key(key: object) -> str:
    """`key` if it is a valid object key; `InvalidRequestError` saying why otherwise."""
    if not isinstance(key, str):
        raise InvalidRequestError(f"a key is a string, not {type(key).__name__}")
    if len(key) > MAX_KEY_CHARS:
        raise InvalidRequestError(f"key longer than {MAX_KEY_CHARS} characters")
    if not _KEY.fullmatch(key) or any(s in (".", "..") for s in key.split("/")):
        raise InvalidRequestError(
            f"bad key {key[:80]!r}: segments of letters, digits, '.', '_' and '-' joined by "
            "'/', none empty, '.' or '..'"
        )
    return key


def check_version(version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int):
        raise InvalidRequestError(f"a version is an integer, not {type(version).__name__}")
    if not 0 <= version <= MAX_VERSION:
        raise InvalidRequestError(f"version {version} outside 0..2**63-1")
    return version


def check_member_id(member_id: object) -> str:
    if not isinstance(member_id, str) or not _MEMBER.fullmatch(member_id):
        raise InvalidRequestError(
            f"bad member id {str(member_id)[:80]!r}: 1 to 128 letters, digits, '.', '_' or '-',"
            " starting with a letter or digit"
        )
    return member_id


@runtime_checkable
class WeightStore(Protocol):
    """A relay object store of versioned weight objects; every method is thread-safe.
    Refusals raise `RelayError` subclasses (see `loom.runtime.relay.errors`)."""

    def put(self, key: str, data: bytes, version: int) -> ObjectInfo:
        """Store `data` under `key` at `version`, whole or not at all (`StoreFullError`)."""
        ...

    def get(self, key: str) -> bytes:
        """The object's bytes (`ObjectMissingError` if absent)."""
        ...

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """Many objects in one request, in the order asked; all or none (a missing key is an
        `ObjectMissingError` naming it). A key may not be asked twice."""
        ...

    def delete(self, key: str) -> ObjectInfo:
        """Remove one object; what it was."""
        ...

    def list(self, version: int | None = None, prefix: str = "") -> builtins.list[ObjectInfo]:
        """Objects (sorted by key), of one version and under a key prefix if given."""
        ...

    def versions(self) -> builtins.list[VersionInfo]:
        """The versions stored, oldest first."""
        ...

    def join(self, member_id: str, role: Role = Role.SERVE, version: int | None = None) -> Member:
        """Add a member, or update one (its role and version); also its heartbeat."""
        ...

    def leave(self, member_id: str) -> Member:
        """Remove a member (`UnknownMemberError` if it is not live); what it was."""
        ...

    def members(self) -> builtins.list[Member]:
        """The live members, by id."""
        ...

    def drop_version(self, version: int) -> VersionInfo:
        """Delete every object of `version`; `VersionNeededError` if a live member may still
        need it (see the retention rule), `UnknownVersionError` if none is stored."""
        ...

    def collect(self) -> builtins.list[int]:
        """Drop every version no live member may need; the versions dropped."""
        ...
