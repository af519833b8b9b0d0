"""The one DSpark decoding loop (batch 1 is batch N with N = 1) and its transformers entry points.

Per step, for the R rows still running:
  draft      one drafter pass -> B drafts per row (+ q, + confidence logits)
  policy     how many drafts l_r each row verifies (all / threshold / scheduler)
  verify     one target forward over [anchor, x_0..x_{l_r-1}] per row (ragged: padded + per-row masks)
  accept     greedy match or rejection sampling (SPEC section 3) on the flat ragged layout
  commit     emit a_r + 1 tokens, cut at EOS / stop strings / max_new_tokens, drop finished rows
  roll back  the target cache and the drafter's context cache keep the anchor + accepted drafts; rejected
             entries become masked holes, cropped when common to all rows, compacted when they pile up.

Entry points: `target.generate(**enc, custom_generate=hf_dspark.generate, drafter=d)` (official, patch-free),
`target.generate(**enc, assistant_model=d)` (routed here by `install_assistant_route`, which intercepts only
calls whose assistant is a `DSparkDrafter`), pipelines, and `custom_generate="<drafter folder or repo>"`.
"""

from __future__ import annotations

import functools
import inspect
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.utils import logging

from .draft_context import DraftContext
from .drafting import Draft, draft_block
from .kernels import build_cu_num_draft, build_verify_inputs, flatten_ragged, gather_kv, rejection_sample
from .modeling import DSparkDrafter
from .processing import Processing
from .scheduler import AdaptiveVerification, ConfidenceThreshold, FullBlock, VerifyPolicy, prior_survival
from .step_costs import catch_up_columns
from .step_table import load_or_profile

logger = logging.get_logger(__name__)

# compact caches once the longest row carries this many rejected holes
COMPACT_HOLES = 32


@dataclass
class DSparkStats:
    """Statistics of one generate call. Accepted lengths include the bonus/correction token (tau)."""

    block_size: int
    steps: int = 0
    drafted_steps: int = 0  # steps that ran the drafter (the scheduler may skip it when drafting does not pay)
    accepted_lengths: list[int] = field(default_factory=list)  # per (row, step): a + 1
    verified_lengths: list[int] = field(default_factory=list)  # per (row, step): drafts verified l
    verified_per_step: list[float] = field(default_factory=list)  # mean drafts verified per request, per step
    rows_per_step: list[int] = field(default_factory=list)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0  # prefill included
    policy_time_s: float = 0.0  # in the verify policy (draft_depth, lengths, observe_step): the scheduler's overhead
    step_seconds: list[float] = field(default_factory=list)  # wall time of each decoding step (prefill excluded)
    conf_logits: list[torch.Tensor] = field(default_factory=list)  # per drafted step [R, B] (NaN past the depth)
    num_accepted: list[torch.Tensor] = field(default_factory=list)  # per step [R] accepted drafts
    num_verified: list[torch.Tensor] = field(default_factory=list)  # per step [R]

    @property
    def verified_tokens(self) -> int:
        return int(sum(self.verified_lengths))

    @property
    def accepted_tokens(self) -> int:
        return int(sum(a - 1 for a in self.accepted_lengths))

    @property
    def mean_accepted_length(self) -> float:
        return sum(self.accepted_lengths) / max(1, len(self.accepted_lengths))

    @property
    def per_position_acceptance(self) -> list[float]:
        """P(draft k accepted | drafts < k accepted and draft k verified), k = 0..B-1."""
        out = []
        for k in range(self.block_size):
            tried = sum(1 for a, l in zip(self.accepted_lengths, self.verified_lengths) if a - 1 >= k and l > k)
            ok = sum(1 for a in self.accepted_lengths if a - 1 >= k + 1)
            out.append(ok / tried if tried else float("nan"))
        return out

    @property
    def mean_verified_per_request(self) -> float:
        return sum(self.verified_lengths) / max(1, len(self.verified_lengths))

    def summary(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "drafted_steps": self.drafted_steps,
            "mean_accepted_length": self.mean_accepted_length,
            "per_position_acceptance": self.per_position_acceptance,
            "verified_tokens": self.verified_tokens,
            "accepted_tokens": self.accepted_tokens,
            "mean_verified_per_request": self.mean_verified_per_request,
            "draft_time_s": self.draft_time_s,
            "verify_time_s": self.verify_time_s,
            "policy_time_s": self.policy_time_s,
        }


@dataclass
class DSparkGenerateOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` plus `dspark_stats`."""

    dspark_stats: DSparkStats | None = None


def _cache_kwarg(model: PreTrainedModel) -> str:
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _choose_policy(
    model: PreTrainedModel,
    drafter: DSparkDrafter,
    verify_policy: VerifyPolicy | None,
    confidence_threshold: float | None,
    adaptive_verification: bool | None,
    num_speculative_tokens: int | None,
) -> VerifyPolicy:
    """Explicit policy > static threshold > scheduler > full block (or the first num_speculative_tokens)."""
    if verify_policy is not None:
        return verify_policy
    temps = (drafter.calibration or {}).get("temperatures")
    if confidence_threshold is not None:
        return ConfidenceThreshold(confidence_threshold, temperatures=temps)
    if adaptive_verification is not False:
        why = None
        if drafter.confidence_head is None:
            why = "the drafter has no confidence head"
        elif adaptive_verification is None and temps is None:
            why = "the drafter has no calibration.json"
        else:
            table = load_or_profile(
                model,
                drafter_repo=getattr(drafter, "name_or_path", None) or None,
                target_id=str(model.name_or_path),
                profile_if_missing=bool(adaptive_verification),
            )
            if table is None:
                why = "no step table is cached for this device (profile one with `hf-dspark profile`)"
            else:
                return _persistent_scheduler(drafter, model, table, temps)
        if adaptive_verification:
            raise ValueError(f"adaptive_verification=True cannot run: {why}.")
        logger.info(f"hf_dspark: adaptive verification is off because {why}; verifying the full block.")
    return FullBlock(num_speculative_tokens)


def _persistent_scheduler(drafter: DSparkDrafter, model: PreTrainedModel, table, temps) -> AdaptiveVerification:
    """The drafter's scheduler for this target and table, kept across generate calls (carry_over=True)."""
    temps_key = None if temps is None else tuple(float(t) for t in temps)
    key = (id(model), str(next(model.parameters()).device), tuple(table.sample_batch_tokens), tuple(table.sample_steps_per_sec), temps_key)
    cached = drafter._dspark_scheduler
    if cached is None or cached[0] != key:
        prior = prior_survival(drafter.calibration, drafter.config.block_size)
        cached = (key, AdaptiveVerification(table, temperatures=temps, carry_over=True, prior_survival=prior))
        drafter._dspark_scheduler = cached
    return cached[1]


def _check_inputs(model, cfg, gen, input_ids, num_speculative_tokens, cache) -> DynamicCache:
    """Refuse what the loop cannot do exactly, with one-sentence errors; returns the (empty, dynamic) cache."""
    if getattr(gen, "num_beams", 1) > 1:
        raise ValueError("DSpark speculative decoding does not support beam search; set num_beams=1.")
    if num_speculative_tokens is not None and not 0 <= num_speculative_tokens <= cfg.block_size:
        raise ValueError(
            f"num_speculative_tokens={num_speculative_tokens} must be in [0, block_size={cfg.block_size}]; the drafter "
            "always drafts its trained block."
        )
    if cache is None:
        cache = DynamicCache(config=model.config)
    if not isinstance(cache, DynamicCache) or any(not isinstance(l, DynamicLayer) or getattr(l, "is_sliding", False) for l in cache.layers):
        raise ValueError(
            f"DSpark needs a dynamic cache, got {type(cache).__name__}; drop cache_implementation='static'/'sliding' "
            "(per-row rollback needs a growable cache)."
        )
    if cache.get_seq_length() > 0:
        raise ValueError("DSpark generation starts from an empty cache; do not pass a pre-filled past_key_values/cache.")
    if input_ids.shape[1] == 0:
        raise ValueError("The prompt is empty; give at least one token (e.g. the BOS token or a chat template).")
    max_pos = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if max_pos is not None and input_ids.shape[1] >= max_pos:
        raise ValueError(f"The prompt has {input_ids.shape[1]} tokens but the target's context is {max_pos}; truncate the prompt.")
    return cache


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    logits_processor: Any = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    generation_config: Any = None,
    synced_gpus: bool = False,
    drafter: DSparkDrafter | None = None,
    dspark_streamer: Any = None,
    stop_strings: str | list[str] | None = None,
    stop_tokenizer: Any = None,
    num_speculative_tokens: int | None = None,
    markov: bool = True,
    confidence_threshold: float | None = None,
    adaptive_verification: bool | None = None,
    verify_policy: VerifyPolicy | None = None,
    **model_kwargs: Any,
) -> torch.LongTensor | DSparkGenerateOutput:
    """DSpark speculative decoding; use as `model.generate(**enc, custom_generate=hf_dspark.generate, drafter=d)`.

    Args:
        drafter: a `DSparkDrafter` bound to `model` (`DSparkDrafter.from_pretrained(..., target=model)`).
        num_speculative_tokens: draft and verify at most this many of the block's B tokens (0: plain decoding).
        markov: False samples the block without the Markov head (pure DFlash on the same weights).
        confidence_threshold: verify drafts while the calibrated confidence stays >= this value.
        adaptive_verification: use the hardware-aware prefix scheduler (needs a step table; see step_table.py).
        verify_policy: any `hf_dspark.scheduler.VerifyPolicy` (overrides the three options above).
        dspark_streamer: a transformers streamer (`streamer=` is consumed by generate() before it reaches here).
        stop_strings, stop_tokenizer: stop strings, cut at the exact stop point inside an accepted block
            (generate() does not hand its tokenizer to a custom_generate callable, hence our own names).

    Returns the sequences `[N, prompt + new]` (finished rows padded), or a `DSparkGenerateOutput` with
    `dspark_stats` when `return_dict_in_generate=True`. The stats are also left on `drafter.last_stats`.
    """
    if drafter is None:
        raise ValueError("hf_dspark.generate needs drafter=<DSparkDrafter>; load one with DSparkDrafter.from_pretrained(..., target=model).")
    drafter = _unwrap_peft(drafter)
    drafter.require_target(model)
    cfg = drafter.config
    gen = generation_config
    cache_key = _cache_kwarg(model)
    cache = model_kwargs.pop(cache_key, None)
    model_kwargs.pop("past_key_values", None)
    cache = _check_inputs(model, cfg, gen, input_ids, num_speculative_tokens, cache)

    device = input_ids.device
    n_rows, prompt_len = input_ids.shape
    attn = model_kwargs.pop("attention_mask", None)
    attn = torch.ones_like(input_ids, dtype=torch.bool) if attn is None else attn.bool()
    model_kwargs.pop("position_ids", None)
    model_kwargs.pop("use_cache", None)
    model_kwargs.pop("logits_to_keep", None)
    max_length = int(gen.max_length) if gen.max_length is not None else prompt_len + 20
    budget = max_length - prompt_len  # new tokens allowed per row
    eos_ids = getattr(gen, "_eos_token_tensor", None)
    eos = set(eos_ids.flatten().tolist()) if eos_ids is not None else set()
    pad_id = getattr(gen, "_pad_token_tensor", None)
    pad_id = int(pad_id) if pad_id is not None else (min(eos) if eos else 0)
    other_criteria = [c for c in (stopping_criteria or []) if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))]
    if stop_strings is not None:
        if stop_tokenizer is None:
            raise ValueError("stop_strings needs the tokenizer: pass stop_tokenizer=tokenizer (or tokenizer= with assistant_model=).")
        other_criteria.append(StopStringCriteria(stop_tokenizer, stop_strings))
    processing = Processing(logits_processor, bool(gen.do_sample), n_rows)
    policy = _choose_policy(model, drafter, verify_policy, confidence_threshold, adaptive_verification, num_speculative_tokens)
    policy.reset()
    stats = DSparkStats(block_size=cfg.block_size)
    streamer = dspark_streamer
    if streamer is not None and n_rows > 1:
        raise ValueError("Streaming supports one prompt at a time (like transformers' streamers); pass a single prompt.")
    if streamer is not None:
        streamer.put(input_ids.cpu())

    generated: list[list[int]] = [[] for _ in range(n_rows)]
    if budget <= 0:
        return _finish(input_ids, generated, pad_id, gen, stats, drafter, streamer)

    keep_kwarg = "logits_to_keep" in inspect.signature(model.forward).parameters

    def target_forward(ids, mask, pos, cache, last_only=False):
        """One target forward appending to `cache` -> logits [R, T, V] (or [R, 1, V] with `last_only`); the taps of
        these tokens go to the drafter's context (projected when the drafter next runs). `mask` [R, C + T] or None
        when every column is valid in every row: like generate(), which drops an all-ones attention mask (given, it
        cost ~0.5 ms of a 61 ms batch-1 decode forward, bf16, 2-core CPU: `scripts/decode_overhead.py 1 bfloat16`)."""
        out = model(
            input_ids=ids,
            attention_mask=None if mask is None else mask.long(),
            position_ids=pos,
            use_cache=True,
            output_hidden_states=drafter.tap_hidden_state_ids,
            **{cache_key: cache},
            **({"logits_to_keep": 1} if last_only and keep_kwarg else {}),
            **model_kwargs,
        )
        context.append([out.hidden_states[i] for i in drafter.tap_hidden_state_ids], pos)  # m x [R, T, H]
        return out.logits

    # ---- prefill: target over the prompt -> first token, taps -> drafter context
    context = DraftContext(drafter)  # columns mirror the target cache's
    positions = (attn.long().cumsum(-1) - 1).clamp(min=0)
    t0 = time.perf_counter()
    dense = bool(attn.all())  # no hole in the cache columns (no padding, no rejected drafts): no attention mask
    logits = target_forward(input_ids, None if dense else attn, positions, cache, last_only=True)  # the lm_head on the last position only
    prompt_rows = [input_ids[r] for r in range(n_rows)]
    scores = processing(logits[:, -1].float(), lambda i: (i, prompt_rows[i]))
    first = torch.multinomial(torch.softmax(scores, -1), 1).squeeze(1) if gen.do_sample else scores.argmax(-1)
    ctx_valid = attn.clone()  # [R, C] mirrors the target cache's validity
    stats.verify_time_s += time.perf_counter() - t0

    rows = torch.arange(n_rows, device=device)  # original row index of each active row
    anchor = first
    anchor_pos = attn.long().sum(-1)  # position of the anchor (first generated token) per row
    active = _commit(generated, rows.tolist(), [[int(t)] for t in first], eos, budget, other_criteria, prompt_rows, streamer)
    rows, anchor, anchor_pos, ctx_valid = _select(active, rows, anchor, anchor_pos, cache, context, ctx_valid)

    while rows.numel() > 0:
        n = rows.numel()
        step_start = time.perf_counter()
        # ---- draft (only as deep as the policy wants and some row can still use)
        row_ids = rows.tolist()
        hist: dict[int, torch.Tensor] = {}  # row -> its generated tokens, built when a processor first asks

        def prefix(i: int, drafts: torch.Tensor, _rows=row_ids, _hist=hist) -> tuple[int, torch.Tensor]:
            """(row, prompt + generated + drafts) for logits processors that read the prefix."""
            row = _rows[i]
            if row not in _hist:
                _hist[row] = torch.tensor(generated[row], dtype=torch.long, device=device)
            return row, torch.cat([prompt_rows[row], _hist[row], drafts])

        caps = [max(budget - len(generated[r]) - 1, 0) for r in row_ids]  # never verify more than a row can emit
        if num_speculative_tokens is not None:
            caps = [min(c, num_speculative_tokens) for c in caps]
        t0 = time.perf_counter()
        pending = context.num_pending  # context columns the drafter has not projected yet
        depth = min(policy.draft_depth(n, cfg.block_size, usable=caps, pending_columns=pending), max(caps))
        stats.policy_time_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        catch_up = None  # (request-columns, seconds) of projecting what plain steps or the prefill left
        if depth > 0:
            ctx_kv = context.kv()
            if catch_up_columns(pending, cfg.block_size):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                catch_up = (n * pending, time.perf_counter() - t0)
            draft = draft_block(drafter, anchor, anchor_pos, ctx_kv, ctx_valid, processing, prefix, markov, depth)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # the policy prices drafting with this wall time
            stats.drafted_steps += 1
        else:  # a plain target step: no drafter pass (the policy judged that drafting does not pay)
            draft = Draft(tokens=torch.empty((n, 0), dtype=torch.long, device=device), q=None, conf_logits=None)
        draft_seconds = time.perf_counter() - t0
        stats.draft_time_s += draft_seconds

        # ---- how many drafts each row verifies (never more than the row can still emit)
        t0 = time.perf_counter()
        width = 1  # the anchor plus the most drafts any row verifies
        if depth > 0:
            lengths = policy.lengths(draft.conf_logits, depth, num_requests=n).to(device)
            lengths = torch.minimum(lengths, torch.tensor(caps, device=device))
            stats.policy_time_s += time.perf_counter() - t0
            width = int(lengths.max()) + 1

        # ---- verify: one target forward over the ragged batch (a plain step when no row verifies a draft: one
        # position per row, none of the ragged layout to build; a batch-1 step on CPU has ~1 ms outside its forward)
        t0 = time.perf_counter()
        if width == 1:
            lengths = torch.zeros(n, dtype=torch.long, device=device)
            valid = torch.ones((n, 1), dtype=torch.bool, device=device)
            verify_ids, verify_pos = anchor[:, None], anchor_pos[:, None]
        else:
            verify_ids, verify_pos, valid = build_verify_inputs(anchor, draft.tokens, lengths, anchor_pos, pad_id)
        # valid [R, width]: the anchor and the verified drafts of each row
        mask = torch.cat([ctx_valid, valid], dim=1)  # [R, C + width]; becomes the next ctx_valid
        dense = dense and (width == 1 or bool(valid.all()))
        logits = target_forward(verify_ids, None if dense else mask, verify_pos, cache).float()  # [R, width, V]
        flat_logits = flatten_ragged(logits, lengths)  # [T, V], row by row (T = R + sum l_r)
        cu = build_cu_num_draft(lengths)  # [R + 1] cumulative draft counts
        draft_ids = draft.tokens[:, : width - 1][valid[:, 1:]] if width > 1 else draft.tokens[:, :0].reshape(0)  # [sum l_r]
        flat_prefix = None
        if processing.reads_prefix:
            flat_slots = valid.nonzero().tolist()  # [T] of (row, slot)
            flat_prefix = lambda j: prefix(flat_slots[j][0], draft.tokens[flat_slots[j][0], : flat_slots[j][1]])
        if gen.do_sample:
            target_probs = processing.probs(flat_logits, flat_prefix)
            draft_probs = draft.q[:, : width - 1][valid[:, 1:]] if draft.q is not None else None  # [sum l_r, V]
            uniforms = torch.rand(draft_ids.shape[0], device=device)
            noise = torch.empty((n, target_probs.shape[1]), device=device).exponential_()
            emitted, num_acc = rejection_sample(target_probs, draft_ids, draft_probs, cu, uniforms, noise, greedy=False)
        else:
            scores = processing(flat_logits, flat_prefix)
            emitted, num_acc = rejection_sample(scores, draft_ids, None, cu, None, None, greedy=True)
        stats.verify_time_s += time.perf_counter() - t0

        # ---- statistics
        stats.steps += 1
        stats.rows_per_step.append(n)
        verified_lengths, accepted = (lengths.tolist(), num_acc.tolist()) if width > 1 else ([0] * n, [0] * n)
        stats.verified_per_step.append(sum(verified_lengths) / n)
        stats.accepted_lengths.extend(a + 1 for a in accepted)
        stats.verified_lengths.extend(verified_lengths)
        if draft.conf_logits is not None:  # None on skipped steps and without a confidence head
            undrafted = cfg.block_size - depth  # slots past the depth: NaN (never verified, so never labelled)
            stats.conf_logits.append(torch.nn.functional.pad(draft.conf_logits.detach().float().cpu(), (0, undrafted), value=float("nan")))
            stats.num_accepted.append(num_acc.cpu())
            stats.num_verified.append(lengths.cpu())

        # ---- commit, then roll back caches to [anchor + accepted drafts] per row
        chunks = [e[: a + 1] for e, a in zip(emitted.tolist(), accepted)]
        active = _commit(generated, row_ids, chunks, eos, budget, other_criteria, prompt_rows, streamer)
        ctx_valid = mask
        if width > 1:
            slot = torch.arange(width, device=device)  # [width]: 0 = the anchor, k = draft k - 1
            ctx_valid[:, -width:] &= slot[None, :] <= num_acc[:, None]  # the anchor and the accepted drafts stay valid
            anchor = emitted[torch.arange(n, device=device), num_acc]
            anchor_pos = anchor_pos + num_acc + 1
        else:
            anchor, anchor_pos = emitted[:, 0], anchor_pos + 1
        rows, anchor, anchor_pos, ctx_valid = _select(active, rows, anchor, anchor_pos, cache, context, ctx_valid)
        if width > 1 or not all(active):  # a plain step of the same rows adds no holes: nothing to crop or compact
            ctx_valid = _trim(cache, context, ctx_valid)
            dense = bool(ctx_valid.all())
        step_seconds = time.perf_counter() - step_start
        stats.step_seconds.append(step_seconds)
        t0 = time.perf_counter()
        policy.observe_step(n, depth, step_seconds, draft_seconds, num_acc if depth > 0 else None, catch_up=catch_up)
        stats.policy_time_s += time.perf_counter() - t0

    return _finish(input_ids, generated, pad_id, gen, stats, drafter, streamer)


def _commit(generated, row_ids, chunks, eos, budget, criteria, prompt_rows, streamer) -> list[bool]:
    """Append each row's emitted tokens, cut at EOS / max_new_tokens / other stopping criteria; -> still active, per row."""
    active = []
    for r, chunk in zip(row_ids, chunks):
        out = generated[r]
        start, done = len(out), False
        for tok in chunk:
            out.append(tok)
            done = tok in eos or len(out) >= budget
            if not done and criteria:
                seq = torch.cat([prompt_rows[r], torch.tensor(out, device=prompt_rows[r].device)])[None]
                done = any(bool(c(seq, None).any()) for c in criteria)
            if done:
                break
        if streamer is not None:
            streamer.put(torch.tensor(out[start:]))
        active.append(not done)
    return active


def _select(active, rows, anchor, anchor_pos, cache: DynamicCache, context: DraftContext, ctx_valid):
    """Drop finished rows from every piece of state (finished rows stop costing compute)."""
    if all(active):
        return rows, anchor, anchor_pos, ctx_valid
    if not any(active):  # the call is over: leave the caches (selecting no row still merged every pending tap: ~15 ms at batch 64)
        return rows[:0], anchor[:0], anchor_pos[:0], ctx_valid[:0]
    idx = torch.tensor([i for i, a in enumerate(active) if a], dtype=torch.long, device=rows.device)
    cache.batch_select_indices(idx)
    context.select(idx)
    return rows[idx], anchor[idx], anchor_pos[idx], ctx_valid[idx]


def _trim(cache: DynamicCache, context: DraftContext, ctx_valid: torch.Tensor) -> torch.Tensor:
    """Crop trailing holes common to all rows; compact when that shortens the cache by COMPACT_HOLES columns or more
    (the row with the most valid entries sets the compacted width) -> ctx_valid."""
    if ctx_valid.shape[0] == 0:
        return ctx_valid
    tail = 0
    if not bool(ctx_valid[:, -1].any()):  # the last column is a hole in every row: find where the holes start
        valid_any = ctx_valid.any(0)
        tail = int(ctx_valid.shape[1] - (valid_any.nonzero().max() + 1)) if valid_any.any() else 0
    if tail > 0:
        cache.crop(-tail)
        context.crop(tail)
        ctx_valid = ctx_valid[:, :-tail]
    width = int(ctx_valid.sum(1).max())  # the compacted width: the most valid entries of any row
    if ctx_valid.shape[1] - width < COMPACT_HOLES:
        # Until 5a18ce6 it also compacted whenever some row had 4 x COMPACT_HOLES holes, which compaction cannot
        # remove when they are left padding: prompts 128+ tokens apart then gathered the whole KV cache every step
        # (79 ms of a 330 ms plain step at batch 64, fp32).
        return ctx_valid
    # right-align each row's valid entries: keep_index [R, width]
    order = torch.sort(ctx_valid.long(), dim=1, stable=True).indices  # invalid first, valid (in order) last
    keep = order[:, -width:]
    ctx_valid = torch.gather(ctx_valid, 1, keep)
    for layer in cache.layers:
        layer.keys = gather_kv(layer.keys, keep)
        layer.values = gather_kv(layer.values, keep)
    context.gather(keep)
    return ctx_valid


def _finish(input_ids, generated, pad_id, gen, stats, drafter, streamer):
    if streamer is not None:
        streamer.end()
    width = max((len(g) for g in generated), default=0)
    new = torch.full((len(generated), width), pad_id, dtype=torch.long, device=input_ids.device)
    for r, g in enumerate(generated):
        if g:
            new[r, : len(g)] = torch.tensor(g, device=input_ids.device)
    sequences = torch.cat([input_ids, new], dim=1)
    drafter.last_stats = stats
    if getattr(gen, "return_dict_in_generate", False):
        return DSparkGenerateOutput(sequences=sequences, dspark_stats=stats)
    return sequences


def _as_drafter(obj: Any) -> DSparkDrafter | None:
    """The DSparkDrafter itself, or the one inside a PEFT model (LoRA layers stay active); else None."""
    if isinstance(obj, DSparkDrafter):
        return obj
    base = getattr(getattr(obj, "base_model", None), "model", None)
    return base if isinstance(base, DSparkDrafter) else None


def _unwrap_peft(drafter: Any) -> DSparkDrafter:
    """Accept a PEFT-wrapped drafter (PeftModel around a DSparkDrafter)."""
    if (base := _as_drafter(drafter)) is not None:
        return base
    raise TypeError(f"drafter must be a DSparkDrafter (or a PEFT model wrapping one), got {type(drafter).__name__}.")


# ---------------------------------------------------------------------------- assistant_model= routing
_ORIGINAL_GENERATE = GenerationMixin.generate


@functools.wraps(_ORIGINAL_GENERATE)
def _generate_with_dspark_route(self, *args: Any, **kwargs: Any):
    assistant = kwargs.get("assistant_model")
    if _as_drafter(assistant) is None:
        return _ORIGINAL_GENERATE(self, *args, **kwargs)
    if kwargs.get("custom_generate") is not None:
        raise ValueError("Pass either assistant_model=<DSparkDrafter> or custom_generate=..., not both.")
    drafter = kwargs.pop("assistant_model")
    kwargs.pop("assistant_tokenizer", None)
    # generate() does not forward these to a custom_generate callable: hand them over under our own names
    kwargs["dspark_streamer"] = kwargs.pop("streamer", None)
    kwargs["stop_tokenizer"] = kwargs.pop("tokenizer", None)
    gen = kwargs.get("generation_config")
    if kwargs.get("stop_strings") is None and gen is not None and getattr(gen, "stop_strings", None) is not None:
        gen = gen.__class__.from_dict(gen.to_dict())
        kwargs["stop_strings"], gen.stop_strings = gen.stop_strings, None
        kwargs["generation_config"] = gen
    return _ORIGINAL_GENERATE(self, *args, custom_generate=generate, drafter=drafter, **kwargs)


def install_assistant_route() -> None:
    """Route `generate(..., assistant_model=<DSparkDrafter>)` to the DSpark loop.

    `GenerationMixin.generate` is wrapped once, at `import hf_dspark`. The wrapper looks only at
    `assistant_model`: any other call (no assistant, or an assistant that is not a DSparkDrafter) goes to the
    original method untouched. transformers' own assisted decoding refuses batches; this route supports them.
    """
    if GenerationMixin.generate is not _generate_with_dspark_route:
        GenerationMixin.generate = _generate_with_dspark_route
