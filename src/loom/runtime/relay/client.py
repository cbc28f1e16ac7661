"""A client of the weight relay (`loom serve relay`): the `WeightStore` interface over HTTP, so
code written against `InMemoryStore` runs against a relay unchanged.

    with RelayClient("http://127.0.0.1:8079") as relay:
        relay.join("serve-0", Role.SERVE)
        relay.put("v3/dense/b000000", bucket, version=3)
        blobs = relay.get_many(["v3/dense/b000000", "v3/dense/b000001"])

The relay's refusals raise the store's own exceptions (`StoreFullError`, `ObjectMissingError`,
...: `loom.runtime.relay.errors`); no answer, or a connection broken mid-answer, raises
`RelayUnreachableError`. One client may be shared by threads. `token` (or `LOOM_TOKEN`) is sent
as a bearer token.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import httpx

from loom.runtime.http_client import HttpClient, checked
from loom.runtime.relay.errors import (
    InvalidRequestError,
    RelayError,
    RelayUnreachableError,
    error_for,
)
from loom.runtime.relay.framing import VERSION_HEADER, BatchDecoder, FramingError
from loom.runtime.relay.store import (
    Member,
    ObjectInfo,
    Role,
    VersionInfo,
    check_key,
    check_member_id,
    check_version,
)

__all__ = ["RelayClient"]

_PIECE = 1 << 20


def _error(status: int, message: str, code: str | None) -> RelayError:
    return error_for(code, status, message)


def _check(resp: httpx.Response) -> Any:
    """The JSON of a success; the store's exception for a refusal (by its code)."""
    return checked(resp, _error)


def _pieces(view: memoryview) -> Iterator[memoryview]:
    """A body in pieces of `_PIECE` bytes."""
    # NOTE: httpcore sends a body of one piece by slicing the rest after each socket send, a
    # copy of the rest every time: a 64 MB bucket whole goes at a third of the speed.
    for start in range(0, view.nbytes, _PIECE):
        yield view[start : start + _PIECE]


def _member(body: dict[str, Any]) -> Member:
    return Member(member_id=body["member_id"], role=Role(body["role"]), version=body["version"])


class RelayClient(HttpClient):
    """A synchronous `WeightStore` over HTTP. `timeout_s` bounds each wait for the relay (to
    connect, or between bytes of an answer), not a whole transfer."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 60.0,
        **httpx_options: Any,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        super().__init__(self.base_url, token=token, timeout_s=timeout_s, **httpx_options)

    @contextlib.contextmanager
    def _reaching(self, what: str) -> Iterator[None]:
        """Transport failures (refused, reset, cut short) as `RelayUnreachableError`."""
        try:
            yield
        except httpx.TransportError as exc:
            raise RelayUnreachableError(
                f"{what}: no whole answer from the relay at {self.base_url} "
                f"({type(exc).__name__}: {exc})"
            ) from exc

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        with self._reaching(f"{method} {path}"):
            resp = self.http.request(method, path, **kwargs)
        return _check(resp)

    # -- objects ---------------------------------------------------------------------------

    def put(self, key: str, data: bytes, version: int) -> ObjectInfo:
        check_key(key)
        check_version(version)
        view = memoryview(data).cast("B")
        body = self._call(
            "PUT",
            f"/v1/objects/{key}",
            params={"version": version},
            content=_pieces(view),
            headers={"Content-Length": str(view.nbytes)},
        )
        return ObjectInfo(**body)

    def get(self, key: str) -> bytes:
        return self.get_with_version(key)[0]

    def get_with_version(self, key: str) -> tuple[bytes, int]:
        check_key(key)
        with self._reaching(f"GET {key}"):
            resp = self.http.get(f"/v1/objects/{key}")
        if resp.is_error:
            _check(resp)
        return resp.content, int(resp.headers[VERSION_HEADER])

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        return {k: data for k, (data, _) in self.get_many_with_versions(keys).items()}

    def get_many_with_versions(self, keys: Sequence[str]) -> dict[str, tuple[bytes, int]]:
        """One batch pull: every object, or the relay's refusal (nothing partial)."""
        keys = [check_key(k) for k in keys]
        what = f"batch of {len(keys)} objects"
        decoder = BatchDecoder()
        with (
            self._reaching(what),
            self.http.stream("POST", "/v1/objects:batch", json={"keys": keys}) as resp,
        ):
            if resp.is_error:
                resp.read()
                _check(resp)
            for chunk in resp.iter_raw():
                decoder.feed(chunk)
        try:
            found = decoder.finish()
        except FramingError as exc:
            raise RelayUnreachableError(f"{what}: {exc}") from exc
        if list(found) != keys:
            raise RelayError(f"{what}: the relay answered with other objects")
        return found

    def delete(self, key: str) -> ObjectInfo:
        check_key(key)
        return ObjectInfo(**self._call("DELETE", f"/v1/objects/{key}"))

    def list(self, version: int | None = None, prefix: str = "") -> builtins.list[ObjectInfo]:
        params: dict[str, Any] = {"prefix": prefix}
        if version is not None:
            params["version"] = version
        body = self._call("GET", "/v1/objects", params=params)
        return [ObjectInfo(**o) for o in body["objects"]]

    # -- versions --------------------------------------------------------------------------

    def versions(self) -> builtins.list[VersionInfo]:
        return [VersionInfo(**v) for v in self._call("GET", "/v1/versions")["versions"]]

    def drop_version(self, version: int) -> VersionInfo:
        check_version(version)
        return VersionInfo(**self._call("DELETE", f"/v1/versions/{version}"))

    def collect(self) -> builtins.list[int]:
        dropped: builtins.list[int] = self._call("POST", "/v1/versions:collect")["dropped"]
        return dropped

    # -- members ---------------------------------------------------------------------------

    def join(self, member_id: str, role: Role = Role.SERVE, version: int | None = None) -> Member:
        check_member_id(member_id)
        try:
            role = Role(role)
        except ValueError:
            raise InvalidRequestError(f"bad role {role!r}: train or serve") from None
        body = {"role": role.value, "version": version}
        return _member(self._call("POST", f"/v1/members/{member_id}", json=body))

    def leave(self, member_id: str) -> Member:
        check_member_id(member_id)
        return _member(self._call("DELETE", f"/v1/members/{member_id}"))

    def members(self) -> builtins.list[Member]:
        return [_member(m) for m in self._call("GET", "/v1/members")["members"]]

    # -- the service -----------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Bytes stored and the cap, objects, versions, members, versions dropped."""
        stats: dict[str, int] = self._call("GET", "/v1/stats")
        return stats
