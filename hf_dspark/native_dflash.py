"""Run a DSpark/DFlash drafter inside transformers' *native* DFlash loop (`speculation_type="dflash"`).

This exists for the side-by-side benchmark: it measures transformers' own DFlash decoding (batch 1 only, B-1
drafts per step, independent per-position argmax, no Markov head) on the same weights our loop uses.

Layouts differ by one slot: transformers reads draft k from block slot k (slot 0 is the anchor and is
discarded), while a DSpark drafter's slot k already predicts token p+k+1. The adapter therefore returns
`[h_0, h_0, ..., h_{B-2}]` so that transformers' `last_hidden_state[:, 1:]` is our `h_0..h_{B-2}`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput

from .draft_context import DraftContext
from .modeling import DSparkDrafter


class NativeDFlashAssistant(nn.Module):
    """Wraps a bound `DSparkDrafter` in the assistant interface `DFlashTokenCandidateGenerator` calls."""

    def __init__(self, drafter: DSparkDrafter) -> None:
        super().__init__()
        if not drafter.config.sample_from_anchor:
            raise ValueError(
                "NativeDFlashAssistant adapts anchor-as-first-prediction drafters; this one has sample_from_anchor=False "
                "(z-lab layout), which the adapter's slot shift would misalign."
            )
        self.drafter = drafter
        self.config = drafter.config
        self._cache_id: int | None = None
        self._context = DraftContext(drafter)

    @property
    def device(self) -> torch.device:
        return self.drafter.device

    @torch.no_grad()
    def forward(
        self,
        noise_embeds: torch.Tensor,  # [1, B, H] embeddings of [anchor, MASK x (B-1)]
        context_hidden_states: torch.Tensor,  # [1, c, m*H] taps of the tokens accepted since the last call
        position_ids: torch.Tensor,  # [1, c + B]
        attention_mask: torch.Tensor | None = None,  # [1, C_total + B] (batch 1: all ones)
        cache: object = None,  # transformers' DFlashCache; identifies one generate call
    ) -> BaseModelOutput:
        d = self.drafter
        if id(cache) != self._cache_id:  # a new generate call: forget the context
            self._cache_id, self._context = id(cache), DraftContext(d)
        b = noise_embeds.shape[1]
        c = context_hidden_states.shape[1]
        self._context.append(context_hidden_states, position_ids[:, :c])
        ctx_kv = self._context.kv()  # this call drafts: everything is projected
        total = ctx_kv[0][0].shape[2]
        mask = torch.ones((1, 1, b, total + b), dtype=torch.bool, device=noise_embeds.device)
        hidden = d.block_hidden(None, position_ids[:, c:], ctx_kv, mask, inputs_embeds=noise_embeds)
        return BaseModelOutput(last_hidden_state=torch.cat([hidden[:, :1], hidden[:, : b - 1]], dim=1))
