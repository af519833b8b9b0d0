"""DSpark training losses (SPEC section 4), over the draft vocabulary and a sparse target distribution.

The target's distribution at each supervised position comes as its top-k (ids in the draft vocabulary, probabilities
renormalised over those k): a small target is peaked, so k = 32 keeps nearly all of its mass, and no loss builds a
[slots, V] temporary beyond the draft logits themselves (one log-sum-exp pass, one gather). q = softmax(draft logits).

Per supervised slot k (0-based position in the block), with position weight w_k = exp(-k / decay):
  KL   KL(p_target || q) = sum_j p_j (log p_j - log q_j) over the target's top-k: the distillation loss, whose
       gradient does not vanish while the draft puts little mass on the target's tokens (early in training)
  CE   cross-entropy of the draft logits against the data's next token (labels the drafter cannot propose: -1, left out)
  L1   sum_v |q_v - p_v| = sum_j |q_j - p_j| + (1 - sum_j q_j)  (p is 0 outside its top-k; full L1 = 2 * TV)
  BCE  binary cross-entropy of the confidence logit against c*_k = sum_v min(q_v, p_v) = 1 - TV (detached soft label)
  ACC  1 - P_k, where P_k = prod_{j<=k} q_j(y_j) is the draft's probability of proposing the greedy labels y (the
       CE's labels: the data's tokens, or the target's argmax with ce_label "target") at every slot of its block up
       to k: a block's sum of P_k is its expected number of accepted greedy drafts, so this term's mean over the
       valid slots (no position weights) is what greedy decoding rewards. Its gradient is the CE's with a weight per
       slot that is the expected number of drafts accepted from that slot on: no gradient where an earlier draft of
       the block already failed.
Each term but ACC is a weighted mean over the valid slots: sum(w * l * valid) / sum(w * valid).
The draft's log-sum-exp, the gathered logits and the argmax come from one pass over [slots, D] in row chunks that
stay in cache (`draft_log_softmax_at`), forward and backward: the unfused ops (an fp32 copy, max, sub, exp, sum,
and in the backward exp, mul, a zero-filled scatter, add, the cast back) took ~44% of a CPU step on cached states.
The paper's DSpark recipe: 0.1 * CE + 0.9 * L1 + 1.0 * BCE (`LossWeights.paper()`); its DFlash baseline: CE only
(`LossWeights.dflash()`). Our default for small budgets: 1.0 * KL + 1.0 * BCE (SPEC 4b, the model card).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class LossWeights:
    ce: float = 0.0
    l1: float = 0.0
    bce: float = 1.0
    decay: float = 4.0  # w_k = exp(-k / decay); 0 or inf = uniform
    kl: float = 1.0
    ce_label: str = "data"  # CE against "data" (the data's next token) or "target" (the target's argmax there)
    accept: float = 0.0  # ACC: 1 - the draft's probability of the block's greedy labels up to each slot

    def __post_init__(self):
        if self.ce_label not in ("data", "target"):
            raise ValueError(f"ce_label={self.ce_label!r}: use 'data' (the data's next token) or 'target' (its argmax).")

    @classmethod
    def paper(cls) -> "LossWeights":
        """The DSpark paper's mix: 0.1 CE + 0.9 L1 + 1.0 BCE."""
        return cls(ce=0.1, l1=0.9, bce=1.0, kl=0.0)

    @classmethod
    def dflash(cls) -> "LossWeights":
        """The DFlash baseline of the paper: CE only."""
        return cls(ce=1.0, l1=0.0, bce=0.0, kl=0.0)

    @property
    def needs_target(self) -> bool:
        """Whether the losses read the target's distribution (KL, L1, the BCE's soft label, or the target label of
        the CE or ACC)."""
        return bool(self.kl or self.l1 or self.bce or ((self.ce or self.accept) and self.ce_label == "target"))


def position_weights(block_size: int, decay: float, device=None) -> torch.Tensor:
    """[B] weights exp(-k / decay) (all ones when decay is 0 or inf)."""
    k = torch.arange(block_size, dtype=torch.float32, device=device)
    if not decay or math.isinf(decay):
        return torch.ones_like(k)
    return torch.exp(-k / decay)


def block_prefix_probability(logq: torch.Tensor, slot: torch.Tensor, block_size: int) -> torch.Tensor:
    """log q of each slot's label [S] -> P_k = prod_{j<=k} q_j over its block [S] (fp32).

    Slots come block by block, each block's valid slots a prefix starting at position 0 (as `valid.nonzero` gives
    them), so a block starts wherever `slot` is 0."""
    block = torch.cumsum(slot == 0, 0) - 1  # [S] the block of each slot
    dense = logq.new_zeros(int(block[-1]) + 1, block_size) if slot.numel() else logq.new_zeros(0, block_size)
    dense = dense.index_put((block, slot), logq.clamp_min(-60.0))  # [blocks, B], log 1 past each valid prefix
    return dense.cumsum(1)[block, slot].exp()


def sparse_target(logits: torch.Tensor, k: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Target logits [..., D] -> (top-k ids [..., k], their probabilities renormalised over the k [..., k])."""
    top, ids = logits.float().topk(min(k, logits.shape[-1]), dim=-1)
    return ids, torch.softmax(top, dim=-1)


class _LogSoftmaxAt(torch.autograd.Function):
    """(logits [S, D], ids [S, k]) -> (log-sum-exp [S], logits at ids [S, k], argmax [S]), all fp32 but the argmax,
    computed `rows` rows at a time; the backward writes d logits in the logits' dtype in the same chunks."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, ids: torch.Tensor, rows: int):
        s = logits.shape[0]
        lse = torch.empty(s, dtype=torch.float32, device=logits.device)
        top = torch.empty(s, dtype=torch.long, device=logits.device)
        for i in range(0, s, rows):
            x = logits[i : i + rows].float()  # [r, D] in cache
            m, top[i : i + rows] = x.max(dim=-1)
            lse[i : i + rows] = m + (x - m[:, None]).exp_().sum(-1).log_()
        ctx.save_for_backward(logits, ids, lse)
        ctx.rows = rows
        ctx.mark_non_differentiable(top)
        return lse, logits.gather(-1, ids).float(), top

    @staticmethod
    def backward(ctx, g_lse: torch.Tensor, g_at: torch.Tensor, _):
        logits, ids, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        g_lse = torch.zeros_like(lse) if g_lse is None else g_lse
        g_at = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device) if g_at is None else g_at.float()
        for i in range(0, logits.shape[0], ctx.rows):
            j = slice(i, i + ctx.rows)
            d = (logits[j].float() - lse[j, None]).exp_().mul_(g_lse[j, None])  # [r, D] softmax * d lse
            grad[j] = d.scatter_add_(-1, ids[j], g_at[j])
        return grad, None, None


def draft_log_softmax_at(
    logits: torch.Tensor, ids: torch.Tensor, rows: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [S, D] (any float dtype), ids [S, k] -> (lse [S] fp32, logits[ids] [S, k] fp32, argmax [S]).

    log q at the ids is `at - lse[:, None]`. On a CPU the work goes `rows` rows at a time (default: ~1 MiB of fp32
    per chunk) so the temporaries stay in cache; elsewhere in one chunk."""
    if rows is None:
        rows = max(1, 2**18 // max(1, logits.shape[-1])) if logits.device.type == "cpu" else max(1, logits.shape[0])
    return _LogSoftmaxAt.apply(logits, ids, rows)


def dspark_losses(
    draft_logits: torch.Tensor,  # [S, D] Markov-corrected teacher-forced draft logits of the valid slots
    slot: torch.Tensor,  # [S] block position k of each slot
    target: tuple[torch.Tensor, torch.Tensor] | None,  # (ids [S, k], probs [S, k]) from sparse_target; None if unneeded
    labels: torch.Tensor,  # [S] the data's next token in the draft vocabulary (-1: not draftable)
    conf_logits: torch.Tensor | None,  # [S] confidence logits (None without a confidence head)
    weights: LossWeights,
    block_size: int,
) -> dict[str, torch.Tensor]:
    """Returns {"loss", "ce", "l1", "kl", "bce", "acc", "soft_accept", "greedy_match", "match"}: the losses, then
    detached statistics (mean c*_k, the rate at which the draft's argmax is the target's (or the label's), and that
    per slot)."""
    w = position_weights(block_size, weights.decay, draft_logits.device)[slot]  # [S]
    denom = w.sum().clamp_min(1e-8)
    ids, p = target if target is not None else (labels.clamp_min(0)[:, None], None)  # [S, k]
    label_col = -1  # the CE label's column in `at`
    if weights.ce_label == "target" and target is not None:
        # the target's argmax over the draft vocabulary (the greedy label on sampled data too), already column 0
        labels, label_col = ids[:, 0], 0
    elif (weights.ce or weights.accept) and target is not None:
        ids = torch.cat([ids, labels.clamp_min(0)[:, None]], dim=-1)  # the label's logit rides along as column k
    lse, at, top = draft_log_softmax_at(draft_logits, ids)  # [S], [S, k(+1)], [S]
    zero = lse.new_zeros(())
    out = {"ce": zero, "l1": zero, "bce": zero, "kl": zero, "acc": zero, "soft_accept": zero}
    logq_label = at[:, label_col] - lse  # [S] log q of the CE's (and ACC's) label
    if weights.ce:
        w_ce = w * (labels >= 0)
        out["ce"] = (-logq_label * w_ce).sum() / w_ce.sum().clamp_min(1e-8)
    if weights.accept and slot.numel():
        drafted = torch.where(labels >= 0, logq_label, torch.full_like(lse, -math.inf))  # an undraftable label: q = 0
        out["acc"] = 1.0 - block_prefix_probability(drafted, slot, block_size).mean()
    reference = labels
    if p is not None:
        logq = at[:, : p.shape[-1]] - lse[:, None]  # [S, k]
        q = logq.exp()
        if weights.kl:
            kl = (p * (p.clamp_min(1e-30).log() - logq)).sum(-1)
            out["kl"] = (kl * w).sum() / denom
        if weights.l1:
            l1 = (q - p).abs().sum(-1) + (1.0 - q.sum(-1)).clamp_min(0.0)
            out["l1"] = (l1 * w).sum() / denom
        soft = torch.minimum(q, p).sum(-1).detach().clamp(0.0, 1.0)  # [S] c*_k = 1 - TV
        if weights.bce and conf_logits is not None:
            bce = F.binary_cross_entropy_with_logits(conf_logits.float(), soft, reduction="none")
            out["bce"] = (bce * w).sum() / denom
        out["soft_accept"] = soft.mean() if soft.numel() else zero
        reference = ids[:, 0]
    out["loss"] = (
        weights.ce * out["ce"] + weights.l1 * out["l1"] + weights.bce * out["bce"] + weights.kl * out["kl"]
        + weights.accept * out["acc"]
    )
    out["match"] = top == reference  # [S]
    out["greedy_match"] = out["match"].float().mean() if slot.numel() else zero
    return out


def expected_tau(match: torch.Tensor, valid: torch.Tensor) -> float:
    """Teacher-forced greedy acceptance proxy: 1 + mean over fully valid blocks of the accepted prefix length,
    match/valid [M, B] bool."""
    full = valid.all(dim=1)
    if not full.any():
        return float("nan")
    prefix = match[full].float().cumprod(dim=1).sum(dim=1)
    return float(1.0 + prefix.mean())


def replayed_decoding(anchors: torch.Tensor, match: torch.Tensor, valid: torch.Tensor) -> tuple[list[int], list[int]]:
    """Greedy decoding replayed on one teacher-forced sequence: the anchors it visits and each block's accepted length.

    The first block starts at the first anchor; each block accepts its matched prefix plus the bonus token and the
    next block starts where it stopped, as `generate()` would on the sequence (greedy self-distilled data). Unlike
    `expected_tau`, which weighs every position alike, this visits the positions decoding visits: mostly the hard
    ones after a rejection. anchors [M] sorted positions, match/valid [M, B] bool."""
    accepted = 1 + (match & valid).long().cumprod(dim=1).sum(dim=1)  # [M]
    at = dict(zip(anchors.tolist(), accepted.tolist()))
    visited, lengths = [], []
    pos = int(anchors[0]) if anchors.numel() else None
    while pos in at:
        visited.append(pos)
        lengths.append(at[pos])
        pos += at[pos]
    return visited, lengths
