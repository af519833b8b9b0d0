"""Applying `generate()`'s logits processors exactly as plain decoding would, row by row.

Plain `generate()` calls each processor with the whole `input_ids` of the step. In a speculative step every
row sits at its own length and every verified position has its own prefix (committed tokens + drafts before
it), so processors that read `input_ids` (repetition penalty, n-gram bans, min-length, ...) are called per
(row, position) with that exact prefix. Such processors may keep per-row state sized for the original batch
(e.g. `prompt_ignore_length`), so each call gets a full-size batch whose every row is that prefix, and we keep
the row that belongs to it. The most common ones, min-length and the repetition penalty, are applied to all rows at
once instead (`_applied_directly`), with the values their own calls give; transformers' other processors that score
each row from its ids alone and keep no per-row state (`ROW_WISE`: no-repeat-ngram, ...) get one call per prefix
length, over all the rows of that length (a tree's nodes at one depth share a length). Processors that only look at
the scores (temperature, top-k, top-p, min-p, typical, epsilon, eta) are applied to all rows at once. Order is kept.

Processors that keep state from call to call, assuming one call per generated token, cannot score several
positions per step and are refused (classifier-free guidance, `guidance_scale`), in both engines: transformers' own
assisted loop would call them once per verified position too.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    ExponentialDecayLengthPenalty,
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
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
# Read input_ids, but each row's scores depend on that row's ids alone and the processor keeps no per-row state
# (exact types only: a subclass may not)
ROW_WISE = (
    NoRepeatNGramLogitsProcessor,
    ExponentialDecayLengthPenalty,
    SuppressTokensAtBeginLogitsProcessor,
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
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
        prefixes = None  # [M] of (original row, ids [S_i]), built once for all the processors that read them
        for proc in self.processors:
            if isinstance(proc, SCORE_ONLY):
                scores = proc(dummy, scores)
                continue
            if prefixes is None:
                prefixes = [prefix(i) for i in range(scores.shape[0])]
            if (direct := _applied_directly(proc, prefixes, scores)) is not None:
                scores = direct
            elif type(proc) in ROW_WISE:
                scores = _by_length(proc, prefixes, scores)
            else:
                scores = torch.stack([self._row(proc, row, ids, scores[i]) for i, (row, ids) in enumerate(prefixes)])
        return scores

    def _row(self, proc, row: int, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        n = self.batch_size
        return proc(ids[None].expand(n, -1), scores[None].expand(n, -1).clone())[row]


def _applied_directly(proc, prefixes: list[tuple[int, torch.Tensor]], scores: torch.Tensor) -> torch.Tensor | None:
    """The most common prefix-reading processors (min-length, repetition penalty) over all M rows [M, V] at once, with
    the values their own calls would give each row; None for the others."""
    kind = type(proc)
    if kind is MinLengthLogitsProcessor:
        short = [i for i, (_, ids) in enumerate(prefixes) if len(ids) < proc.min_length]
        return _ban_eos(scores, short, proc.eos_token_id)
    if kind is MinNewTokensLengthLogitsProcessor:
        skip, least = proc.prompt_length_to_skip, proc.min_new_tokens
        short = [i for i, (_, ids) in enumerate(prefixes) if len(ids) - skip < least]
        return _ban_eos(scores, short, proc.eos_token_id)
    if kind is RepetitionPenaltyLogitsProcessor:  # generate() ignores each row's left padding: a tensor [batch]
        ignore = proc.prompt_ignore_length
        starts = ignore.tolist() if isinstance(ignore, torch.Tensor) else None
        seen = [ids[starts[row] if starts else ignore or 0 :] for row, ids in prefixes]
        return _penalize_seen(scores, seen, proc.penalty)
    return None


def _ban_eos(scores: torch.Tensor, rows: list[int], eos_token_id) -> torch.Tensor:
    """scores [M, V] with -inf at the EOS ids in `rows` (ids outside the vocabulary ignored, as torch.isin does)."""
    vocab = scores.shape[-1]
    eos = torch.as_tensor(eos_token_id, device=scores.device).view(-1)
    eos = eos[(eos >= 0) & (eos < vocab)]
    if not rows or not eos.numel():
        return scores
    scores = scores.clone()
    scores[torch.tensor(rows, device=scores.device)[:, None], eos[None]] = -float("inf")
    return scores


def _penalize_seen(scores: torch.Tensor, seen: list[torch.Tensor], penalty: float) -> torch.Tensor:
    """The repetition penalty: in each row of scores [M, V], the ids in its `seen` [S_i] (ids past the vocabulary
    ignored) divided by `penalty` where positive, multiplied where negative."""
    vocab = scores.shape[-1]
    ids = pad_sequence(seen, batch_first=True, padding_value=vocab).clamp(max=vocab)  # [M, max S_i], vocab: no id
    mask = torch.zeros(scores.shape[0], vocab + 1, dtype=torch.bool, device=scores.device).scatter_(1, ids, True)
    return torch.where(mask[:, :vocab], torch.where(scores < 0, scores * penalty, scores / penalty), scores)


def _by_length(proc, prefixes: list[tuple[int, torch.Tensor]], scores: torch.Tensor) -> torch.Tensor:
    """A row-wise processor over M rows [M, V]: one call per prefix length, on the ids [k, S] of the k rows of that
    length."""
    groups: dict[int, list[int]] = {}
    for i, (_, ids) in enumerate(prefixes):
        groups.setdefault(ids.shape[0], []).append(i)
    if len(groups) == 1:
        return proc(torch.stack([ids for _, ids in prefixes]), scores)
    out = torch.empty_like(scores)
    for rows in groups.values():
        index = torch.tensor(rows, device=scores.device)
        out[index] = proc(torch.stack([prefixes[i][1] for i in rows]), scores[index])
    return out
