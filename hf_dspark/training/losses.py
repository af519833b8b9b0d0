"""DSpark training losses (SPEC section 4).

Per supervised slot k (0-based position in the block), with position weight w_k = exp(-k / decay):
  CE   cross-entropy of the (Markov-corrected, teacher-forced) draft logits against the label token
  L1   sum_v |softmax(draft) - softmax(target)|  (full L1 = 2 * total variation)
  BCE  binary cross-entropy of the confidence logit against c*_k = sum_v min(p_draft, p_target) = 1 - TV
       (detached soft label)
Each term is a weighted mean over the valid slots: sum(w * l * valid) / sum(w * valid).
DSpark: 0.1 * CE + 0.9 * L1 + 1.0 * BCE.  DFlash twin: CE only (`LossWeights(ce=1, l1=0, bce=0)`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class LossWeights:
    ce: float = 0.1
    l1: float = 0.9
    bce: float = 1.0
    decay: float = 4.0  # w_k = exp(-k / decay); 0 or inf = uniform

    @classmethod
    def dflash(cls) -> "LossWeights":
        return cls(ce=1.0, l1=0.0, bce=0.0)


def position_weights(block_size: int, decay: float, device=None) -> torch.Tensor:
    """[B] weights exp(-k / decay) (all ones when decay is 0 or inf)."""
    k = torch.arange(block_size, dtype=torch.float32, device=device)
    if not decay or math.isinf(decay):
        return torch.ones_like(k)
    return torch.exp(-k / decay)


def dspark_losses(
    draft_logits: torch.Tensor,  # [M, B, V] Markov-corrected teacher-forced draft logits
    target_logits: torch.Tensor | None,  # [M, B, V] target logits for the same positions (None if l1 = bce = 0)
    labels: torch.Tensor,  # [M, B] label ids x_{p+1..p+B}
    valid: torch.Tensor,  # [M, B] bool, the supervised (contiguous valid) prefix of each block
    conf_logits: torch.Tensor | None,  # [M, B] confidence logits (None without a confidence head)
    weights: LossWeights,
) -> dict[str, torch.Tensor]:
    """Returns {"loss", "ce", "l1", "bce", "soft_accept", "greedy_match"} (the last two detached statistics:
    mean c*_k and the rate at which argmax(draft) == argmax(target) over valid slots)."""
    b = draft_logits.shape[1]
    w = position_weights(b, weights.decay, draft_logits.device)[None, :] * valid.float()  # [M, B]
    denom = w.sum().clamp_min(1e-8)
    logp = F.log_softmax(draft_logits.float(), dim=-1)  # [M, B, V]
    ce = -(logp.gather(-1, labels[..., None].clamp_min(0)).squeeze(-1))  # [M, B]
    out = {"ce": (ce * w).sum() / denom}
    zero = draft_logits.new_zeros((), dtype=torch.float32)
    out["l1"], out["bce"] = zero, zero
    stats_soft, stats_match = zero, zero
    if target_logits is not None:
        p_draft = logp.exp()
        p_target = F.softmax(target_logits.float(), dim=-1)
        overlap = torch.minimum(p_draft, p_target).sum(-1)  # [M, B] = 1 - TV
        if weights.l1:
            l1 = (p_draft - p_target).abs().sum(-1)
            out["l1"] = (l1 * w).sum() / denom
        soft = overlap.detach().clamp(0.0, 1.0)
        if weights.bce and conf_logits is not None:
            bce = F.binary_cross_entropy_with_logits(conf_logits.float(), soft, reduction="none")
            out["bce"] = (bce * w).sum() / denom
        with torch.no_grad():
            n = valid.float().sum().clamp_min(1)
            stats_soft = (soft * valid).sum() / n
            stats_match = ((draft_logits.argmax(-1) == target_logits.argmax(-1)).float() * valid).sum() / n
    else:
        with torch.no_grad():
            n = valid.float().sum().clamp_min(1)
            stats_match = ((draft_logits.argmax(-1) == labels).float() * valid).sum() / n
    out["loss"] = weights.ce * out["ce"] + weights.l1 * out["l1"] + weights.bce * out["bce"]
    out["soft_accept"], out["greedy_match"] = stats_soft, stats_match
    return out


def expected_tau(match: torch.Tensor, valid: torch.Tensor) -> float:
    """Teacher-forced greedy acceptance proxy: 1 + mean over fully valid blocks of the accepted prefix length,
    match/valid [M, B] bool."""
    full = valid.all(dim=1)
    if not full.any():
        return float("nan")
    prefix = match[full].float().cumprod(dim=1).sum(dim=1)
    return float(1.0 + prefix.mean())
