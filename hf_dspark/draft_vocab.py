"""Speculators-style reduced draft vocabularies: checking the maps between the draft and the target vocabulary.

A drafter that proposes only D of the target's V tokens carries `d2t` [D] (integer offsets: target id = draft id +
d2t[draft id]) and `t2d` [V] (bool: the target id is draftable), exactly as vllm-project/speculators writes them.
"""

from __future__ import annotations

import torch


def check_draft_maps(d2t: torch.Tensor, t2d: torch.Tensor | None, vocab_size: int, draft_vocab_size: int) -> None:
    """Validate speculators-style vocabulary maps: d2t [D] integer offsets (target id = draft id + d2t[draft id]),
    t2d [V] bool marking the same target ids. Raises a ValueError naming the field."""
    if d2t.dtype.is_floating_point or d2t.dtype == torch.bool or tuple(d2t.shape) != (draft_vocab_size,):
        raise ValueError(
            f"d2t must be an integer tensor of shape [draft_vocab_size={draft_vocab_size}], got {d2t.dtype} "
            f"{tuple(d2t.shape)}; the checkpoint's vocabulary maps do not match its config."
        )
    ids = torch.arange(draft_vocab_size, device=d2t.device) + d2t.long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"d2t maps draft ids outside the target vocabulary [0, {vocab_size}); the maps are corrupt.")
    if torch.unique(ids).numel() != ids.numel():
        raise ValueError("d2t maps two draft ids to the same target id; each draft token must be a distinct target token.")
    if t2d is None:
        return
    if t2d.dtype != torch.bool or tuple(t2d.shape) != (vocab_size,):
        raise ValueError(
            f"t2d must be a bool tensor of shape [vocab_size={vocab_size}], got {t2d.dtype} {tuple(t2d.shape)}; "
            "the checkpoint's vocabulary maps do not match its config."
        )
    mark = torch.zeros(vocab_size, dtype=torch.bool, device=t2d.device)
    mark[ids.to(t2d.device)] = True
    if not torch.equal(mark, t2d):
        raise ValueError("t2d and d2t disagree on which target tokens are draftable; the maps are corrupt.")
