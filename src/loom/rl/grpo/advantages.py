"""GRPO's advantages: each sample's reward against its group's (the samples of one prompt),
divided by the group's spread; a group whose samples all earned alike teaches nothing (0)."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["group_advantages"]


def group_advantages(
    rewards: Sequence[float], groups: Sequence[str], *, eps: float = 1e-6
) -> list[float]:
    """(r - mean of its group) / (std of its group + eps), the std with Bessel's correction
    as GRPO's reference code takes it; 0 where the group's rewards are all equal."""
    if len(rewards) != len(groups):
        raise ValueError(f"{len(rewards)} rewards for {len(groups)} group labels")
    members: dict[str, list[float]] = {}
    for r, g in zip(rewards, groups, strict=True):
        members.setdefault(g, []).append(float(r))
    stats = {}
    for g, rs in members.items():
        mean = sum(rs) / len(rs)
        var = sum((r - mean) ** 2 for r in rs) / max(1, len(rs) - 1)
        stats[g] = (mean, math.sqrt(var))
    out = []
    for r, g in zip(rewards, groups, strict=True):
        mean, std = stats[g]
        out.append(0.0 if std == 0.0 else (float(r) - mean) / (std + eps))
    return out
