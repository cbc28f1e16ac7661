"""Which versions a weight store keeps: every version at or above a floor that the live members
set (the rule is stated in `loom.runtime.relay.store`). Pure functions of the versions stored
and the members."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from loom.runtime.relay.store import Member, Role

__all__ = ["floor", "needed_by"]


def _bound(member: Member, present: Sequence[int]) -> int | None:
    """The oldest version `member` may need (None: only the newest)."""
    if member.version is None:
        return None
    if member.role is Role.SERVE:
        return member.version + 1  # the deltas after the version it holds
    below = bisect.bisect_left(present, member.version)  # versions older than the one published
    return present[below - 1] if below else member.version


def floor(present: Sequence[int], members: Iterable[Member]) -> int | None:
    """The oldest version to keep, given the versions stored (sorted ascending) and the live
    members; None when nothing is stored."""
    if not present:
        return None
    lowest = present[-1]
    for m in members:
        bound = _bound(m, present)
        if bound is not None and bound < lowest:
            lowest = bound
    return lowest


def needed_by(version: int, present: Sequence[int], members: Iterable[Member]) -> list[str]:
    """Why `version` must stay: the members that may need it, or that it is the newest."""
    why = [
        f"{m.role.value} member {m.member_id!r} at version {m.version}"
        for m in members
        if (bound := _bound(m, present)) is not None and bound <= version
    ]
    if present and version >= present[-1]:
        why.append("it is the newest version")
    return why
