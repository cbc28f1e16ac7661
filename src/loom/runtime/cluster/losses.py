"""The losses `forward_backward` computes, named by its payload: supervised negative
log-likelihood, REINFORCE's policy gradient, and PPO's clipped importance ratio (GRPO's loss).

Each is a function of one rank's rows — the per-token log-probabilities under the current
weights, the loss mask, the rows' advantages and, for PPO, the log-probabilities under the
policy that sampled them — and returns that rank's share of the batch's loss: its rows' terms
divided by a normaliser taken from the whole batch, so that the ranks' shares sum to the loss of
the batch computed at once, and their gradients summed over the data-parallel ranks to its
gradient. Aggregation: `token` averages over every scored token of the batch (DAPO's, Dr. GRPO's
token-level mean), `sequence` over each row's tokens and then over the rows (GRPO's paper).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["Agg", "LossBatch", "LossKind", "LossOut", "loss_of"]


class LossKind(StrEnum):
    NLL = "nll"  # supervised: -log p of the scored tokens
    PG = "pg"  # REINFORCE: -A · log p
    PPO = "ppo"  # clipped importance ratio: -min(r·A, clip(r, 1-ε, 1+ε_high)·A)


class Agg(StrEnum):
    TOKEN = "token"  # the mean over every scored token of the batch
    SEQUENCE = "sequence"  # the mean over each row's scored tokens, then over the rows


@dataclass(frozen=True, kw_only=True)
class LossBatch:
    """One rank's rows (torch tensors on its device) and the batch's normaliser."""

    logp: Any  # [rows, T-1] log p(token t+1 | tokens ..t) under the current weights
    mask: Any  # [rows, T-1] 1.0 where a token is scored, else 0.0
    advantages: Any | None  # [rows]
    old_logp: Any | None  # [rows, T-1] under the policy that sampled the rows (PPO)
    agg: Agg
    norm: float  # the whole batch's scored tokens (token) or rows (sequence)
    clip_low: float = 0.2
    clip_high: float = 0.2


@dataclass(frozen=True)
class LossOut:
    loss: Any  # this rank's share of the batch's loss (a scalar tensor, with gradient)
    # sums over this rank's scored tokens, for the batch's statistics (summed over ranks)
    stats: dict[str, Any]


def _reduce(terms: Any, b: LossBatch) -> Any:
    """This rank's share of the batch's mean of per-token `terms`."""
    if b.agg is Agg.TOKEN:
        return (terms * b.mask).sum() / b.norm
    per_row = (terms * b.mask).sum(-1) / b.mask.sum(-1).clamp(min=1.0)
    return per_row.sum() / b.norm


def _nll(b: LossBatch) -> LossOut:
    return LossOut(_reduce(-b.logp, b), {})


def _pg(b: LossBatch) -> LossOut:
    assert b.advantages is not None, "the pg loss needs advantages"
    return LossOut(_reduce(-b.advantages[:, None] * b.logp, b), {})


def _ppo(b: LossBatch) -> LossOut:
    import torch

    assert b.advantages is not None and b.old_logp is not None, "ppo needs advantages, old logp"
    adv = b.advantages[:, None]
    ratio = torch.exp(b.logp - b.old_logp)
    clipped = ratio.clamp(1.0 - b.clip_low, 1.0 + b.clip_high)
    terms = -torch.minimum(ratio * adv, clipped * adv)
    with torch.no_grad():
        m = b.mask > 0
        r = ratio[m]
        hit = ((ratio * adv) > (clipped * adv))[m]  # where the clipped term is the one taken
        big = torch.tensor(float("inf"), dtype=ratio.dtype, device=ratio.device)
        stats = {
            "ratio_sum": r.sum(),
            "ratio_sq_sum": (r * r).sum(),
            "ratio_min": r.min() if r.numel() else big,
            "ratio_max": r.max() if r.numel() else -big,
            "clipped": hit.sum().to(ratio.dtype),
        }
    return LossOut(_reduce(terms, b), stats)


_LOSSES: dict[LossKind, Callable[[LossBatch], LossOut]] = {
    LossKind.NLL: _nll,
    LossKind.PG: _pg,
    LossKind.PPO: _ppo,
}


def loss_of(kind: LossKind | str, batch: LossBatch) -> LossOut:
    """This rank's share of loss `kind` over `batch`."""
    return _LOSSES[LossKind(kind)](batch)
