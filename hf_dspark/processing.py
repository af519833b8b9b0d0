"""Applying `generate()`'s logits processors exactly as plain decoding would, row by row.

Plain `generate()` calls each processor with the whole `input_ids` of the step. In a speculative step every
row sits at its own length and every verified position has its own prefix (committed tokens + drafts before
it), so processors that read `input_ids` (repetition penalty, n-gram bans, min-length, ...) are called per
(row, position) with that exact prefix. Such processors may keep per-row state sized for the original batch
(e.g. `prompt_ignore_length`), so each call gets a full-size batch whose every row is that prefix, and we keep
the row that belongs to it. Processors that only look at the scores (temperature, top-k, top-p,
min-p, typical, epsilon, eta) are applied to all rows at once. Order is kept.

Processors that keep state from call to call, assuming one call per generated token, cannot score several
positions per step and are refused (classifier-free guidance, `guidance_scale`), in both engines: transformers' own
assisted loop would call them once per verified position too.
"""

from __future__ import annotations

from typing import Callable

import torch
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
    UnbatchedClassifierFreeGuidanceLogitsProcessor,
)

SCORE_ONLY = (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    MinPLogitsWarper,
    TypicalLogitsWarper,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
)


class Processing:
    """Turns raw logits into what plain decoding samples from (or takes the argmax of)."""

    def __init__(self, logits_processor: LogitsProcessorList | None, do_sample: bool, batch_size: int = 1) -> None:
        self.processors = list(logits_processor or [])
        if any(isinstance(p, UnbatchedClassifierFreeGuidanceLogitsProcessor) for p in self.processors):
            raise ValueError(
                "Classifier-free guidance (guidance_scale) cannot run with speculative decoding: its processor runs the "
                "model on the negative prompt with a cache of its own, one token per call, while a speculative step "
                "scores several positions. Drop guidance_scale, or generate without assistant_model."
            )
        self.batch_size = batch_size
        self.do_sample = do_sample
        self.reads_prefix = any(not isinstance(p, SCORE_ONLY) for p in self.processors)
        self.temperature_only = all(isinstance(p, TemperatureLogitsWarper) for p in self.processors)

    def __call__(
        self,
        scores: torch.Tensor,  # [M, V] float32 raw logits
        prefix: Callable[[int], tuple[int, torch.Tensor]] | None = None,  # i -> (original row, input_ids prefix [S_i])
    ) -> torch.Tensor:  # [M, V] processed scores
        if not self.processors:
            return scores
        dummy = scores.new_zeros((scores.shape[0], 1), dtype=torch.long)
        for proc in self.processors:
            if isinstance(proc, SCORE_ONLY):
                scores = proc(dummy, scores)
            else:
                scores = torch.stack([self._row(proc, *prefix(i), scores[i]) for i in range(scores.shape[0])])
        return scores

    def _row(self, proc, row: int, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        n = self.batch_size
        return proc(ids[None].expand(n, -1), scores[None].expand(n, -1).clone())[row]

    def probs(self, scores: torch.Tensor, prefix: Callable[[int], tuple[int, torch.Tensor]] | None = None) -> torch.Tensor:
        """[M, V] raw logits -> [M, V] sampling distribution."""
        return torch.softmax(self(scores, prefix), dim=-1)
