"""A worker-process group's errors are Loom errors: a service answers a broken group with 503
(its deployment is unavailable until started again) and any other worker failure with 500,
and a caller catches the whole family as `WorkerError`."""

from __future__ import annotations

import pytest

from loom.core.errors import LoomError, Unavailable, http_status
from loom.runtime.cluster.wpg import BadMessage, GroupBroken, RankFailed, WorkerError
from loom.runtime.cluster.wpg.errors import FailureKind


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (WorkerError("rank 0 failed to start"), 500, "worker_failed"),
        (RankFailed("rank 1: RuntimeError: boom", frozenset({0})), 500, "rank_failed"),
        (GroupBroken("rank 0 (pid 7) exited (13)"), 503, "unavailable"),
        (BadMessage("a malformed message"), 500, "bad_message"),
    ],
)
def test_each_error_maps_to_its_status_and_code(exc: WorkerError, status: int, code: str) -> None:
    assert isinstance(exc, WorkerError) and isinstance(exc, LoomError)
    assert isinstance(exc, RuntimeError)  # (what it was before it was a LoomError)
    assert http_status(exc) == status
    assert exc.code == code


def test_a_broken_group_is_an_unavailable_deployment() -> None:
    assert isinstance(GroupBroken("gone"), Unavailable)


def test_a_rank_failure_keeps_what_the_rank_said() -> None:
    exc = RankFailed("x", frozenset({0, 2}), error="ConfigError", kind=FailureKind.REFUSED)
    assert exc.pending == {0, 2} and exc.error == "ConfigError"
    assert exc.kind is FailureKind.REFUSED
    assert RankFailed("x", frozenset()).kind is FailureKind.RAISED
