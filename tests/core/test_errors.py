"""Errors of one kind: defined once in `loom.core.errors`, mapped to HTTP statuses in one place
(`http_status`) that every service uses; no service module names an error status itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loom.core import errors as e
from loom.runtime.relay import errors as relay

SRC = Path(__file__).resolve().parents[2] / "src" / "loom"


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        (e.InvalidRequest, 400),
        (e.ConfigError, 400),
        (e.TooLarge, 413),
        (e.Unauthorized, 401),
        (e.NotFound, 404),
        (e.Conflict, 409),
        (e.StorageFull, 507),
        (e.Unavailable, 503),
        (e.UpstreamError, 502),
        (RuntimeError, 500),
    ],
)
def test_each_kind_has_one_status(kind: type[BaseException], status: int) -> None:
    assert e.http_status(kind("x")) == status


def test_the_services_own_errors_are_the_kinds() -> None:
    from loom.runtime.actions.driver import ServerClosingError, UnknownActionError
    from loom.runtime.rollout.engines import EngineRejected
    from loom.runtime.rollout.fields import BadRequest

    assert issubclass(relay.ObjectMissingError, e.NotFound)
    assert issubclass(relay.VersionConflictError, e.Conflict)
    assert issubclass(relay.StoreFullError, e.StorageFull)
    assert relay.ObjectMissingError("gone").status == 404
    assert issubclass(UnknownActionError, e.NotFound)
    assert issubclass(ServerClosingError, e.Unavailable)
    assert issubclass(BadRequest, e.InvalidRequest)
    assert e.http_status(EngineRejected(422, "the engine said")) == 422  # relayed as it came


def test_no_service_module_names_an_error_status() -> None:
    """Error statuses are `http_status`'s; a service raises a kind. (The stand-in engine is a
    fake SGLang server, not a Loom service.)"""
    pattern = re.compile(
        r"HTTPException\(\s*[45]\d\d|status_code=[45]\d\d|status=[45]\d\d|_error\([^)]*,\s*[45]\d\d\)"
    )
    skip = {SRC / "core" / "errors.py", SRC / "runtime" / "rollout" / "standin.py"}
    offenders = [
        f"{path.relative_to(SRC)}:{n}"
        for path in SRC.rglob("*.py")
        if path not in skip
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders, offenders
