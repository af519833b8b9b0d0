"""`DSparkCandidateGenerator`: DSpark drafting inside transformers' own assisted loop (`_assisted_decoding`).

transformers' loop (batch 1) owns the target's forwards, verification (greedy match, or `_speculative_sampling`
with the q we return), the KV cache and its crop, logits processors, stopping criteria, the streamer and the
output. Each step it asks the generator for candidates and then reports how many matched.

The generator drafts with `drafting.draft_block`, the function our batched loop calls (one drafting
implementation), over the drafter's context (`DraftContext`) that it keeps in step with the target's cache:
with `requires_model_outputs` the loop hands it the previous target forward, whose hidden states at the drafter's
tapped layers (`model_kwargs_overrides`) cover the tokens that forward fed. Only the committed ones enter the
context -- the whole prompt after the prefill, then the anchor and the accepted drafts -- so a rejection never
leaves columns to crop, exactly as the loop's cache crop leaves none. The confidence threshold, when set, cuts the
block before verification on c_k, which never depends on x_k: the truncation is non-anticipating and the output
stays exact.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.generation.logits_process import LogitsProcessorList
from transformers.utils import ModelOutput

from . import drafting
from .draft_context import DraftContext
from .generation import DSparkStats, cache_kwarg, check_cache, check_num_speculative_tokens, choose_policy, unwrap_drafter
from .prepack import prepack_like
from .processing import Processing


class DSparkCandidateGenerator(CandidateGenerator):
    """Candidates for transformers' assisted decoding from a DSpark drafter: one block per step, drafted left to right
    with the Markov head (sampled when `do_sample`, else greedy), returned with the distributions q they were sampled
    from (as logits: softmax(log q) = q), so that transformers' rejection sampling is exact.

    transformers builds it through the `_get_candidate_generator` that binding installs on the target
    (`model.generate(..., assistant_model=drafter, dspark_engine="transformers")`); statistics go to
    `drafter.last_stats` as in our loop (accepted counts as the loop reports them: cut at EOS).

    Args:
        drafter: a `DSparkDrafter` (or a PEFT model around one), bound to `target` (bound here if unbound).
        target: the model whose `generate()` runs the loop.
        generation_config: the call's generation config (`do_sample`, `max_length`).
        logits_processor: the call's processors; the drafts' q is processed like the target's p.
        model_kwargs: the call's model kwargs (the target's cache is checked: dynamic and empty).
        confidence_threshold: verify drafts while the calibrated confidence stays >= this value (None: all).
        num_speculative_tokens: draft and verify at most this many of the block (0: plain decoding).
        markov: False drafts without the Markov head (DFlash on the same weights).
    """

    requires_model_outputs = True

    def __init__(
        self,
        drafter: Any,
        target: PreTrainedModel,
        generation_config: GenerationConfig,
        logits_processor: LogitsProcessorList | None = None,
        model_kwargs: dict[str, Any] | None = None,
        confidence_threshold: float | None = None,
        num_speculative_tokens: int | None = None,
        markov: bool = True,
    ) -> None:
        drafter = unwrap_drafter(drafter)
        drafter.require_target(target)
        prepack_like(drafter, target)
        block_size = drafter.config.block_size
        check_num_speculative_tokens(num_speculative_tokens, block_size)
        check_cache(target, (model_kwargs or {}).get(cache_kwarg(target)))
        self.drafter = drafter
        self.model_kwargs_overrides = {"output_hidden_states": drafter.tap_hidden_state_ids}  # only the tapped layers
        self.processing = Processing(logits_processor, bool(generation_config.do_sample), batch_size=1)
        self.policy = choose_policy(target, drafter, None, confidence_threshold, False, num_speculative_tokens)
        self.policy.reset()
        self.max_length = int(generation_config.max_length)
        self.max_drafts = block_size if num_speculative_tokens is None else num_speculative_tokens
        self.markov = markov
        self.context = DraftContext(drafter)
        self.columns = 0  # committed tokens in the drafter's context (= the target's cache length)
        self.stats = DSparkStats(block_size=block_size)
        drafter.last_stats = self.stats
        self._step: tuple[int, torch.Tensor | None, int] | None = None  # (depth, conf_logits, drafts verified)

    @torch.no_grad()
    def get_candidates(
        self,
        input_ids: torch.LongTensor,  # [1, S]: the committed sequence; its last token is the anchor
        model_kwargs: dict[str, Any],
        model_outputs: ModelOutput | None,
        is_first_iteration: bool,
        **kwargs: Any,
    ) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """-> ([1, S + l] the sequence and l drafts, [1, l, V] log q of the drafts when sampling, else None)."""
        self._step = None
        if is_first_iteration:  # the prefill runs first: its hidden states seed the drafter's context
            return input_ids, None
        positions = model_kwargs.get("position_ids")  # [1, S], grown by the loop
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        self._append_committed(model_outputs, positions, input_ids.shape[1] - 1)
        room = min(self.max_length - input_ids.shape[1] - 1, self.max_drafts)  # drafts that can still be committed
        depth = min(self.policy.draft_depth(1, self.stats.block_size, usable=[room], pending_columns=self.context.num_pending), room)
        self._step = (0, None, 0)
        if depth <= 0:
            return input_ids, None
        mask = model_kwargs.get("attention_mask")  # [1, S] or None (all ones)
        valid = mask[:, :-1].bool() if mask is not None else input_ids.new_ones((1, self.columns), dtype=torch.bool)
        prefix = lambda i, drafts: (0, torch.cat([input_ids[0], drafts]))  # noqa: E731 - what processors read
        draft = drafting.draft_block(
            self.drafter, input_ids[:, -1], positions[:, -1], self.context.kv(), valid, self.processing, prefix,
            self.markov, depth,
        )
        self.stats.drafted_steps += 1
        length = int(self.policy.lengths(draft.conf_logits, depth, num_requests=1)[0])
        self._step = (depth, draft.conf_logits, length)
        if length == 0:
            return input_ids, None
        candidates = torch.cat([input_ids, draft.tokens[:, :length].to(input_ids.device)], dim=1)
        return candidates, (draft.q[:, :length].log() if draft.q is not None else None)

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        """Record the step in `drafter.last_stats` (the block size never adapts: the drafter was trained for it)."""
        if self._step is None:  # the prefill
            return
        depth, conf_logits, length = self._step
        accepted = int(num_matches)
        lengths, num_acc = torch.tensor([length]), torch.tensor([accepted])
        self.stats.record_step(depth, conf_logits, lengths, length + 1, num_acc, [accepted])

    def _append_committed(self, outputs: ModelOutput, positions: torch.Tensor, columns: int) -> None:
        """The previous target forward's tapped hidden states of the tokens it committed (the first `columns` -
        `self.columns` it fed) -> the drafter's context, at their positions."""
        new = columns - self.columns
        taps = [outputs.hidden_states[i][:, :new] for i in self.drafter.tap_hidden_state_ids]  # m x [1, new, H]
        self.context.append(taps, positions[:, self.columns : columns])
        self.columns = columns
