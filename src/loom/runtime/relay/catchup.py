"""How a serving member reaches the newest weights from the version it holds: apply the deltas
after it when every one is still stored, else pull a dense version (and the deltas after that
one). A pure function of what is stored; it returns the plan as data."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["CatchUp", "CatchUpKind", "plan_catch_up"]


class CatchUpKind(StrEnum):
    CURRENT = "current"  # it holds the newest version already
    DELTA = "delta"  # deltas only, from the version it holds
    DENSE = "dense"  # a dense version first (then any deltas after it)
    NONE = "none"  # nothing complete is stored that it could load


@dataclass(frozen=True, slots=True, kw_only=True)
class CatchUp:
    kind: CatchUpKind
    target: int | None  # the version the member holds after the plan
    steps: tuple[tuple[int, str], ...]  # (version, stream) to pull and apply, in order
    reason: str  # in words, for logs and for members told they cannot take deltas


def _chain(start: int, target: int, complete: Mapping[int, Collection[str]], delta: str) -> bool:
    return all(delta in complete.get(v, ()) for v in range(start + 1, target + 1))


def plan_catch_up(
    held: int | None,
    complete: Mapping[int, Collection[str]],
    *,
    dense: str = "dense",
    delta: str = "delta",
) -> CatchUp:
    """The plan for a member holding `held` (None: nothing), given the streams stored whole
    per version (`complete[v]`: stream names with a manifest). A delta of version `v` takes
    `v - 1` to `v`; the plan reaches the newest version it can, by the fewest dense pulls."""
    newest = max((v for v, s in complete.items() if dense in s or delta in s), default=None)
    if newest is None:
        return CatchUp(kind=CatchUpKind.NONE, target=None, steps=(), reason="nothing is stored")
    if held is not None and held >= newest:
        return CatchUp(
            kind=CatchUpKind.CURRENT, target=held, steps=(), reason=f"holds {held}, the newest"
        )
    for target in sorted(complete, reverse=True):
        if held is not None and target <= held:
            break  # nothing newer than what it holds can be reached
        if held is not None and _chain(held, target, complete, delta):
            steps = tuple((v, delta) for v in range(held + 1, target + 1))
            return CatchUp(
                kind=CatchUpKind.DELTA,
                target=target,
                steps=steps,
                reason=f"the deltas of {held + 1}..{target} apply to the {held} it holds",
            )
        bases = [d for d in complete if d <= target and dense in complete[d]]
        for base in sorted(bases, reverse=True):
            if _chain(base, target, complete, delta):
                steps = ((base, dense), *((v, delta) for v in range(base + 1, target + 1)))
                return CatchUp(
                    kind=CatchUpKind.DENSE,
                    target=target,
                    steps=steps,
                    reason=_why_dense(held, target, complete, delta),
                )
    return CatchUp(
        kind=CatchUpKind.NONE,
        target=held,
        steps=(),
        reason=f"no whole {dense!r} version, nor deltas from {held}, reach a newer version",
    )


def _why_dense(
    held: int | None, target: int, complete: Mapping[int, Collection[str]], delta: str
) -> str:
    if held is None:
        return "holds nothing yet"
    gap = next(v for v in range(held + 1, target + 1) if delta not in complete.get(v, ()))
    return f"holds {held}, but the delta of {gap} is not stored (dropped, or never pushed)"
