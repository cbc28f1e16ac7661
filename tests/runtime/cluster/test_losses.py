"""The losses `forward_backward` names, on tensors: PPO's clipped ratio term by hand, the two
aggregations, and data-parallel shares that sum to the whole batch's loss and gradient."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from loom.runtime.cluster.losses import Agg, LossBatch, LossKind, loss_of  # noqa: E402

pytestmark = pytest.mark.torch


def batch(logp, mask, adv=None, old=None, agg=Agg.TOKEN, norm=None, clip=0.2, high=0.2):  # type: ignore[no-untyped-def]
    if norm is None:
        norm = float(mask.sum()) if agg is Agg.TOKEN else float(mask.shape[0])
    return LossBatch(
        logp=logp, mask=mask, advantages=adv, old_logp=old, agg=agg, norm=norm,
        clip_low=clip, clip_high=high,
    )  # fmt: skip


def test_ppo_takes_the_pessimistic_clipped_term() -> None:
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    # ratios 1.5 (clipped to 1.2 for A>0), 0.5 (clipped to 0.8, but min keeps 0.5·A), 1.0
    logp = torch.log(torch.tensor([[0.75, 0.25, 0.5]]))
    mask = torch.ones(1, 3)
    out = loss_of(LossKind.PPO, batch(logp, mask, torch.tensor([2.0]), old))
    want = -(1.2 * 2 + 0.5 * 2 + 1.0 * 2) / 3
    assert out.loss.item() == pytest.approx(want, rel=1e-6)
    assert out.stats["clipped"].item() == 1  # only the first token's clipped term was taken
    assert out.stats["ratio_max"].item() == pytest.approx(1.5)
    # a negative advantage: the ratio below 1 - ε is clipped, the one above is not
    out = loss_of(LossKind.PPO, batch(logp, mask, torch.tensor([-1.0]), old))
    assert out.loss.item() == pytest.approx((1.5 + 0.8 + 1.0) / 3, rel=1e-6)


def test_sequence_mean_weights_rows_alike_and_token_mean_weights_tokens() -> None:
    logp = torch.tensor([[-1.0, -1.0, -1.0], [-4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    tok = loss_of(LossKind.NLL, batch(logp, mask, agg=Agg.TOKEN)).loss.item()
    seq = loss_of(LossKind.NLL, batch(logp, mask, agg=Agg.SEQUENCE)).loss.item()
    assert tok == pytest.approx((3 + 4) / 4) and seq == pytest.approx((1 + 4) / 2)


@pytest.mark.parametrize("kind", list(LossKind))
@pytest.mark.parametrize("agg", list(Agg))
def test_rank_shares_sum_to_the_whole_batch(kind: LossKind, agg: Agg) -> None:
    """Rows split over two ranks with the whole batch's normaliser: the shares' losses and
    gradients add up to the loss and gradient of the batch at once."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(5, 7, generator=gen, requires_grad=True)
    logits = torch.randn(4, 6, 5, generator=gen)
    targets = torch.randint(0, 7, (4, 6), generator=gen)
    mask = (torch.rand(4, 6, generator=gen) > 0.3).float()
    adv = None if kind is LossKind.NLL else torch.randn(4, generator=gen)
    old = torch.randn(4, 6, generator=gen).clamp(max=0) - 1 if kind is LossKind.PPO else None
    norm = float(mask.sum()) if agg is Agg.TOKEN else 4.0

    def loss(rows: slice) -> torch.Tensor:
        logp = torch.log_softmax(logits[rows] @ w, -1).gather(-1, targets[rows, :, None])[..., 0]
        b = LossBatch(
            logp=logp, mask=mask[rows], advantages=None if adv is None else adv[rows],
            old_logp=None if old is None else old[rows], agg=agg, norm=norm,
        )  # fmt: skip
        out: torch.Tensor = loss_of(kind, b).loss
        return out

    whole = loss(slice(None))
    (g_whole,) = torch.autograd.grad(whole, w)
    shares = [loss(slice(r, None, 2)) for r in range(2)]
    g_shares = [torch.autograd.grad(s, w)[0] for s in shares]
    assert (shares[0] + shares[1]).item() == pytest.approx(whole.item(), rel=1e-5, abs=1e-6)
    assert torch.allclose(g_shares[0] + g_shares[1], g_whole, atol=1e-6)
