"""ROSE's dual-SLO admission (§4.1): on a lent serving instance, serving runs first and a
rollout iteration runs only when its predicted time fits the serving SLO slack.

On a prefiller the slack is Eq. 1 over the queued serving prefills,
    S_r = (t_arr + B_TTFT) − t_now − T̂_prf(L_r, m),
on a decoder Eq. 2 over the active serving decodes,
    S_r = (t_last + B_TPOT) − t_now − T̂_dec(b),
each taken at its minimum over the queue. A rollout iteration (its running decodes plus at most
one prefill chunk of 512 tokens) is admitted when its predicted time is at most that slack. The
variants of Fig. 9 enforce only one of the two SLOs (`ttft_only`, `tpot_only`) or none. A rollout
request that makes no progress for 2 s is dropped and reported as stalled (§4.1), so that the
scheduler re-routes its trajectory.

Plain functions of the instance's state and injected cost profiles: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from loom.core.errors import ConfigError
from loom.core.registry import Registry

__all__ = [
    "ADMISSION_POLICIES",
    "AdmissionKind",
    "Role",
    "ServingSlo",
    "StallWatch",
    "admits",
    "slack_s",
    "tpot_slack_s",
    "ttft_slack_s",
]

ROLLOUT_CHUNK_TOKENS = 512  # §4.1: rollout prefills are chunked to 512 tokens


class Role(StrEnum):
    """The serving instance's role under PD disaggregation (§4: prefill:decode = 1:3);
    `colocated` is §4.3's extension, where both SLOs bind one instance."""

    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"


class AdmissionKind(StrEnum):
    DUAL_SLO = "dual_slo"  # ROSE: the SLO of the instance's role
    TTFT_ONLY = "ttft_only"  # Fig. 9: TTFT enforced, TPOT ignored
    TPOT_ONLY = "tpot_only"  # Fig. 9: TPOT enforced, TTFT ignored
    NONE = "none"  # no admission control: rollout iterations run whenever they are ready


# Which SLOs each kind enforces: (TTFT, TPOT).
ADMISSION_POLICIES: Registry[AdmissionKind, tuple[bool, bool]] = Registry(
    "admission", AdmissionKind
)
ADMISSION_POLICIES.add(AdmissionKind.DUAL_SLO, (True, True))
ADMISSION_POLICIES.add(AdmissionKind.TTFT_ONLY, (True, False))
ADMISSION_POLICIES.add(AdmissionKind.TPOT_ONLY, (False, True))
ADMISSION_POLICIES.add(AdmissionKind.NONE, (False, False))


@dataclass(frozen=True, kw_only=True)
class ServingSlo:
    """P99 targets of the serving model (§6: Qwen2.5-7B 500 ms / 150 ms; Qwen2.5-32B 1000 ms /
    450 ms)."""

    ttft_s: float = field(metadata={"help": "B_TTFT: time to first token"})
    tpot_s: float = field(metadata={"help": "B_TPOT: time per output token"})

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0):
            raise ConfigError(f"SLOs must be > 0 s, got TTFT {self.ttft_s}, TPOT {self.tpot_s}")


def ttft_slack_s(
    queued: Iterable[tuple[float, int]],
    now: float,
    slo: ServingSlo,
    prefill_s: Callable[[int], float],
) -> float:
    """Eq. 1 at its minimum over the queued serving prefills `(arrival, prompt tokens)`;
    +inf when none waits. `prefill_s(L)` is the profiled T̂_prf of the serving prefill mode."""
    return min(
        (arrival + slo.ttft_s - now - prefill_s(tokens) for arrival, tokens in queued),
        default=math.inf,
    )


def tpot_slack_s(
    last_token_s: Iterable[float],
    now: float,
    slo: ServingSlo,
    decode_s: Callable[[int], float],
) -> float:
    """Eq. 2 at its minimum over the active serving decodes (the time each produced its last
    token); +inf when none decodes. `decode_s(b)` is the profiled T̂_dec at batch b."""
    lasts = list(last_token_s)
    if not lasts:
        return math.inf
    step = decode_s(len(lasts))
    return min(last + slo.tpot_s - now - step for last in lasts)


def slack_s(role: Role, kind: AdmissionKind, ttft_slack: float, tpot_slack: float) -> float:
    """The slack a rollout iteration must fit on an instance of `role` under `kind`: the
    SLOs the kind enforces among those the role carries (+inf: nothing binds)."""
    ttft_on, tpot_on = ADMISSION_POLICIES.get(kind)
    out = math.inf
    if ttft_on and role in (Role.PREFILL, Role.COLOCATED):
        out = min(out, ttft_slack)
    if tpot_on and role in (Role.DECODE, Role.COLOCATED):
        out = min(out, tpot_slack)
    return out


def admits(slack: float, iteration_s: float) -> bool:
    """Whether a rollout iteration predicted to take `iteration_s` fits `slack`."""
    if not iteration_s >= 0:
        raise ConfigError(f"a predicted iteration time must be >= 0 s, got {iteration_s}")
    return iteration_s <= slack


class StallWatch:
    """Rollout requests on one instance and when each last made progress: one without
    progress for `timeout_s` (§4.1: 2 s) is stalled."""

    def __init__(self, timeout_s: float = 2.0) -> None:
        if not timeout_s > 0:
            raise ConfigError(f"stall timeout must be > 0 s, got {timeout_s}")
        self.timeout_s = timeout_s
        self._last: dict[int, float] = {}

    def __contains__(self, request: int) -> bool:
        return request in self._last

    def __len__(self) -> int:
        return len(self._last)

    def progress(self, request: int, now: float) -> None:
        """`request` was admitted or advanced at `now`."""
        self._last[request] = now

    def forget(self, request: int) -> None:
        self._last.pop(request, None)

    def stalled(self, now: float) -> list[int]:
        """Requests without progress for the timeout, oldest first; they are forgotten."""
        out = sorted(
            (r for r, t in self._last.items() if now - t >= self.timeout_s),
            key=lambda r: (self._last[r], r),
        )
        for r in out:
            del self._last[r]
        return out

    def next_deadline(self) -> float | None:
        return min(self._last.values()) + self.timeout_s if self._last else None
