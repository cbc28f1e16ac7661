"""Heddle's trajectory-aware transmission scheduler for KV-cache migrations (§5.3).

Each epoch it takes pending migrations longest trajectory first and greedily keeps those
whose source and destination are both free of selected or running transfers, so a batch is
strictly parallel (endpoint-exclusive) and long-tail trajectories move first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["MigrationRequest", "select_batch"]


@dataclass(frozen=True, slots=True)
class MigrationRequest:
    traj_id: int
    src: int
    dst: int
    tokens: int
    predicted_length: float  # priority: longer first


def select_batch(
    pending: Sequence[MigrationRequest], busy_endpoints: Iterable[int] = ()
) -> list[MigrationRequest]:
    """The requests to start now: longest first, no two sharing a source or destination,
    none touching an endpoint already busy with a running transfer."""
    busy = set(busy_endpoints)
    chosen: list[MigrationRequest] = []
    for req in sorted(pending, key=lambda r: (-r.predicted_length, r.traj_id)):
        if req.src in busy or req.dst in busy:
            continue
        chosen.append(req)
        busy.add(req.src)
        busy.add(req.dst)
    return chosen
