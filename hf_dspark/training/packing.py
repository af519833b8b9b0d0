"""Anchor sampling and block packing: every block of a sequence goes through the drafter in one pass.

For an anchor at position p the block is [x_p, MASK x (B-1)] at positions p..p+B-1 with labels x_{p+1..p+B}.
All A blocks of a sequence form one query stream of A*B tokens. Attention mask (True = visible), per query of
block a: context key j is visible iff j < p_a (and j is a real token); block keys are visible iff they belong to
the same block (bidirectional inside the block); padding blocks (anchor -1) see nothing (`PackedBlockMask.dense()`;
the drafter's attention reads the compact form, `modeling.packed_block_attention`).
Only the contiguous valid prefix of a block is supervised (labels inside the sequence and in the response).
This mask is the full-attention one; the drafter's sliding_attention layers (`DSparkConfig.layer_types`) derive theirs
from it in `DSparkDrafter.block_hidden` (`modeling.sliding_window_mask`): context keys p-W..p-1 only, causal inside the
block unless `sliding_window_non_causal` -- speculators' training mask, checked against speculators' own forward in
tests/test_speculators_fixtures.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..modeling import PackedBlockMask


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """loss_mask [T] bool -> sorted anchor positions [<= num_anchors]: positions p where the response covers p
    and p + 1, sampled without replacement."""
    cand = torch.nonzero(loss_mask[:-1] & loss_mask[1:]).flatten()
    if cand.numel() > num_anchors:
        pick = torch.randperm(cand.numel(), generator=generator)[:num_anchors]
        cand = cand[pick].sort().values
    return cand


@dataclass
class PackedBlocks:
    block_ids: torch.Tensor  # [N, A*B] anchor + MASK tokens (padding blocks: MASK)
    positions: torch.Tensor  # [N, A*B] absolute positions p..p+B-1 (padding blocks: 0..B-1)
    mask: PackedBlockMask  # context [N, A, T] visible iff before the anchor; each block sees itself
    labels: torch.Tensor  # [N, A, B] x_{p+1..p+B} (0 where invalid)
    prev_ids: torch.Tensor  # [N, A, B] teacher-forced previous tokens x_{p..p+B-1}
    target_pos: torch.Tensor  # [N, A, B] positions p..p+B-1 whose target state predicts the label (clamped)
    valid: torch.Tensor  # [N, A, B] bool, contiguous supervised prefix


def pack_blocks(
    input_ids: torch.Tensor,  # [N, T] right-padded
    loss_mask: torch.Tensor,  # [N, T] bool (False on padding)
    anchors: torch.Tensor,  # [N, A] anchor positions, -1 = padding block
    block_size: int,
    mask_token_id: int,
) -> PackedBlocks:
    n, t = input_ids.shape
    a, b = anchors.shape[1], block_size
    dev = input_ids.device
    real = anchors >= 0  # [N, A]
    p = anchors.clamp_min(0)
    k = torch.arange(b, device=dev)
    pos = p[..., None] + k  # [N, A, B]
    block_ids = torch.full((n, a, b), mask_token_id, dtype=input_ids.dtype, device=dev)
    block_ids[..., 0] = torch.where(real, input_ids.gather(1, p), torch.full_like(p, mask_token_id))
    label_pos = pos + 1
    inside = label_pos < t
    lp = label_pos.clamp(max=t - 1).view(n, -1)
    labels = input_ids.gather(1, lp).view(n, a, b)
    ok = inside & loss_mask.gather(1, lp).view(n, a, b) & real[..., None]
    valid = ok.long().cumprod(dim=-1).bool()  # contiguous prefix
    labels = torch.where(valid, labels, torch.zeros_like(labels))
    prev = input_ids.gather(1, pos.clamp(max=t - 1).view(n, -1)).view(n, a, b)
    mask = PackedBlockMask(torch.arange(t, device=dev)[None, None, :] < anchors[..., None], real, b)  # -1 anchors: none
    positions = torch.where(real[..., None], pos, k.expand(n, a, b))
    return PackedBlocks(
        block_ids=block_ids.view(n, a * b),
        positions=positions.view(n, a * b),
        mask=mask,
        labels=labels,
        prev_ids=prev,
        target_pos=pos.clamp(max=t - 1),
        valid=valid,
    )


def pad_batch(
    seqs: list[tuple[torch.Tensor, torch.Tensor]], anchor_lists: list[torch.Tensor], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad sequences and anchor lists -> input_ids [N, T], loss_mask [N, T], attention [N, T], anchors [N, A]."""
    t = max(len(ids) for ids, _ in seqs)
    a = max(1, max(len(x) for x in anchor_lists))
    n = len(seqs)
    ids = torch.full((n, t), pad_id, dtype=torch.long)
    lm = torch.zeros((n, t), dtype=torch.bool)
    att = torch.zeros((n, t), dtype=torch.long)
    anchors = torch.full((n, a), -1, dtype=torch.long)
    for i, ((x, m), anc) in enumerate(zip(seqs, anchor_lists)):
        ids[i, : len(x)] = x
        lm[i, : len(x)] = m
        att[i, : len(x)] = 1
        anchors[i, : len(anc)] = anc
    return ids, lm, att, anchors
