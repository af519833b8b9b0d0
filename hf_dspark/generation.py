"""The one DSpark decoding loop (batch 1 is batch N with N = 1) and its transformers entry points.

Vocabulary (as in vLLM's rejection sampler): a row's *anchor* is its last committed token, whose K/V is not in the
caches yet; the *drafts* x_0..x_{L-1} are the drafter's guesses for the tokens after it (L = the step's depth);
row r *verifies* its first l_r drafts and *accepts* the first a_r the target agrees with; then the target's own
token follows: the *recovered* token at the first rejection, the *bonus* token when all were accepted. The row
commits a_r + 1 tokens and the last one is its next anchor. Rejected drafts leave *holes* in the caches: masked,
cropped when common to all rows, compacted when they pile up.

`generate` is a short driver over named steps. `_Call` holds what a call fixes (models, caches, policy, sampling,
stopping), `_Rows` what changes (the running rows, their anchors and positions, the cache columns they attend to):

    _prefill        the target over the prompts -> first token per row; its taps -> the drafter's context
    _decode_step    per step, for the R rows still running:
      _choose_depth   how many drafts to make (the policy: full block / threshold / scheduler; 0 = a plain step)
      _draft          one drafter pass -> drafts, q, confidence logits (or a tree of drafts: `draft_tree_size`)
      _verify         how many drafts each row verifies, then one target forward over [anchor, x_0..x_{l_r-1}]
                      (over [anchor, tree nodes] with a tree attention mask)
      _accept         greedy match or rejection sampling (SPEC section 3) on the flat ragged layout (a tree: walked
                      with the target's token at each node)
      _commit         commit a_r + 1 tokens (cut at EOS / stop strings / max_new_tokens), roll the caches back to
                      [anchor + accepted drafts] (a tree's accepted path first), drop finished rows, crop / compact
                      holes
    _finish         the padded sequences and the statistics

Shapes: N prompts of P tokens, R running rows, B block size, W = 1 + max l_r verify positions per row, C cache
columns, V vocabulary, T = R + sum l_r flat verify rows.

Entry points: `target.generate(**enc, custom_generate=hf_dspark.generate, drafter=d)` (official),
`target.generate(**enc, assistant_model=d)` on a model the drafter is bound to (`hf_dspark.routing`), pipelines,
and `custom_generate="<drafter folder or repo>"`. transformers' own assisted loop drives the same drafting code
through `hf_dspark.candidate_generator.DSparkCandidateGenerator`.
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.utils import logging

from . import drafting
from .attention import grouped_kv_heads_under_masks
from .draft_context import DraftContext, reorder_last
from .draft_tree import NO_NODE, TREE_TOP_K, accept_tree, ancestor_mask, check_draft_tree_size, graft_branch
from .drafting import Draft
from .kernels import (build_cu_num_draft, build_verify_inputs, exp_noise, first_argmax, flatten_ragged, gather_kv,
                      rejection_sample, sample_index, sample_rows)
from .modeling import DSparkDrafter
from .prepack import prepack_like
from .processing import Processing
from .prompt_lookup import DEFAULT_COPY_NGRAM, TREE_COPY_RATE, CopyIndex, LookupRates, PromptLookup, check_copy_ngram
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
    tree_size: int | None = None  # the draft tree each drafting step verified (None: chains)
    lookup_tokens: int | None = None  # the longest prompt-lookup branch grafted onto it (None: no branch)
    steps: int = 0
    drafted_steps: int = 0  # steps that ran the drafter (the scheduler may skip it when drafting does not pay)
    accepted_lengths: list[int] = field(default_factory=list)  # per (row, step): a + 1
    verified_lengths: list[int] = field(default_factory=list)  # per (row, step): drafts verified l
    verified_per_step: list[float] = field(default_factory=list)  # mean drafts verified per request, per step
    rows_per_step: list[int] = field(default_factory=list)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0  # target forwards (prefill included) and acceptance
    policy_time_s: float = 0.0  # in the verify policy (draft_depth, lengths, observe_step): the scheduler's overhead
    step_seconds: list[float] = field(default_factory=list)  # wall time of each decoding step (prefill excluded)
    conf_logits: list[torch.Tensor] = field(default_factory=list)  # per drafted step [R, B] (NaN past the depth)
    num_accepted: list[torch.Tensor] = field(default_factory=list)  # per step [R] accepted drafts
    num_verified: list[torch.Tensor] = field(default_factory=list)  # per step [R]

    def record_step(self, depth: int, conf_logits, lengths, width: int, num_acc, accepted: list[int]) -> None:
        """One decoding step of R rows: drafted `depth` slots (conf_logits [R, depth] or None), verified lengths [R]
        (none when width == 1), accepted num_acc [R] (the same as the list `accepted`)."""
        n = len(accepted)
        self.steps += 1
        self.rows_per_step.append(n)
        verified = lengths.tolist() if width > 1 else [0] * n
        self.verified_per_step.append(sum(verified) / n)
        self.accepted_lengths.extend(a + 1 for a in accepted)
        self.verified_lengths.extend(verified)
        if conf_logits is not None:  # None on skipped steps and without a confidence head
            undrafted = self.block_size - depth  # slots past the depth: NaN (never verified, so never labelled)
            padded = torch.nn.functional.pad(conf_logits.detach().float().cpu(), (0, undrafted), value=float("nan"))
            self.conf_logits.append(padded)
            self.num_accepted.append(num_acc.cpu())
            self.num_verified.append(lengths.cpu())

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
        """P(draft k accepted | drafts < k accepted and draft k verified), k = 0..B-1; NaN where no step verified a
        draft at k (the scheduler verified fewer, or never drafted)."""
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
            "tree_size": self.tree_size,
            "lookup_tokens": self.lookup_tokens,
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


@dataclass
class _KeptOutputs:
    """What return_dict_in_generate asks to keep of each committed token (`output_scores`, `output_logits`): per row
    the processed scores and the raw logits [V] it was chosen from, as plain generate() returns them step by step."""

    scores: list[list[torch.Tensor]] | None  # per row, chunks [k, V] in commit order
    logits: list[list[torch.Tensor]] | None

    @classmethod
    def for_call(cls, gen: Any, num_rows: int) -> "_KeptOutputs | None":
        if not getattr(gen, "return_dict_in_generate", False):
            return None
        keep = lambda name: [[] for _ in range(num_rows)] if getattr(gen, name, False) else None  # noqa: E731
        kept = cls(scores=keep("output_scores"), logits=keep("output_logits"))
        return kept if kept.scores is not None or kept.logits is not None else None

    def add(self, row: int, picks: list[int], scores: torch.Tensor, logits: torch.Tensor) -> None:
        """Row `row` committed the tokens chosen at rows `picks` of the step's scores / logits [M, V]."""
        index = torch.tensor(picks, device=scores.device)
        for kept, values in ((self.scores, scores), (self.logits, logits)):
            if kept is not None:
                kept[row].append(values.index_select(0, index))

    def per_step(self, width: int) -> dict[str, tuple[torch.Tensor, ...] | None]:
        """-> scores / logits: a tuple of `width` tensors [N, V], plain generate()'s layout; a row that finished early
        holds zeros past its end (plain decoding keeps scoring finished rows; our loop has dropped them)."""
        out = {}
        for name, kept in (("scores", self.scores), ("logits", self.logits)):
            if kept is None:
                out[name] = None
                continue
            rows = [torch.cat(chunks) for chunks in kept]  # N x [G_r, V]
            full = rows[0].new_zeros((len(rows), width, rows[0].shape[-1]))  # [N, width, V]
            for r, values in enumerate(rows):
                full[r, : values.shape[0]] = values
            out[name] = full.unbind(1)
        return out


def cache_kwarg(model: PreTrainedModel) -> str:
    """The name of the target forward's cache argument ("cache" from transformers 5.24, "past_key_values" before)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def takes_logits_to_keep(model: PreTrainedModel) -> bool:
    """Whether the target's forward can skip the logits of all but the last positions (`logits_to_keep`)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def choose_policy(
    model: PreTrainedModel,
    drafter: DSparkDrafter,
    verify_policy: VerifyPolicy | None,
    confidence_threshold: float | None,
    adaptive_verification: bool | None,
    num_speculative_tokens: int | None,
    quiet: bool = False,
) -> VerifyPolicy:
    """Explicit policy > static threshold > scheduler > full block (or the first num_speculative_tokens). Where the
    scheduler was wanted but cannot run, the full block says why (`fallback_reason`), logged unless `quiet`."""
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
        if not quiet:
            _log_fallback(why)
        return FullBlock(num_speculative_tokens, fallback_reason=why)
    return FullBlock(num_speculative_tokens)


def _log_fallback(why: str) -> None:
    logger.info(f"hf_dspark: adaptive verification is off because {why}; verifying the full block.")


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


BEAM_SEARCH_REFUSED = "DSpark speculative decoding does not support beam search; set num_beams=1."


def _check_inputs(model, cfg, gen, input_ids, num_speculative_tokens, cache) -> DynamicCache:
    """Refuse what the loop cannot do exactly, with one-sentence errors; returns the (empty, dynamic) cache."""
    if getattr(gen, "num_beams", 1) > 1:
        raise ValueError(BEAM_SEARCH_REFUSED)
    if getattr(gen, "return_dict_in_generate", False):
        for name in ("output_attentions", "output_hidden_states"):
            if getattr(gen, name, False):
                raise ValueError(
                    f"{name}=True is not supported by DSpark's loop (it returns sequences, scores and logits); run one "
                    "prompt with dspark_engine='transformers' (transformers' assisted loop), or generate without "
                    "assistant_model."
                )
    check_num_speculative_tokens(num_speculative_tokens, cfg.block_size)
    cache = check_cache(model, cache)
    if input_ids.shape[1] == 0:
        raise ValueError("The prompt is empty; give at least one token (e.g. the BOS token or a chat template).")
    max_pos = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if max_pos is not None and input_ids.shape[1] >= max_pos:
        raise ValueError(f"The prompt has {input_ids.shape[1]} tokens but the target's context is {max_pos}; truncate the prompt.")
    return cache


def check_num_speculative_tokens(num_speculative_tokens: int | None, block_size: int) -> None:
    """num_speculative_tokens must be None or in 0..block_size."""
    if num_speculative_tokens is not None and not 0 <= num_speculative_tokens <= block_size:
        raise ValueError(
            f"num_speculative_tokens={num_speculative_tokens} must be in [0, block_size={block_size}]; the drafter "
            "always drafts its trained block."
        )


def check_cache(model: PreTrainedModel, cache: Any) -> DynamicCache:
    """The target's cache for a DSpark call: a new DynamicCache when None; refused unless dynamic (no static or
    sliding layers: rollback needs a growable cache) and empty (the drafter needs the prompt's hidden states)."""
    if cache is None:
        cache = DynamicCache(config=model.config)
    if not isinstance(cache, DynamicCache) or any(not isinstance(l, DynamicLayer) or getattr(l, "is_sliding", False) for l in cache.layers):
        raise ValueError(
            f"DSpark needs a dynamic cache, got {type(cache).__name__}; drop cache_implementation='static'/'sliding' "
            "(per-row rollback needs a growable cache)."
        )
    if cache.get_seq_length() > 0:
        raise ValueError("DSpark generation starts from an empty cache; do not pass a pre-filled past_key_values/cache.")
    return cache


@dataclass
class _Call:
    """What one generate call fixes: the models and their caches, the verify policy, sampling and stopping."""

    model: PreTrainedModel
    drafter: DSparkDrafter
    cache: DynamicCache  # the target's KV cache, per layer [R, heads, C, head_dim]
    context: DraftContext  # the drafter's context K/V; its C columns mirror the target cache's
    policy: VerifyPolicy
    processing: Processing
    stats: DSparkStats
    do_sample: bool
    markov: bool  # False: sample the block without the Markov head (DFlash)
    budget: int  # new tokens allowed per row
    max_drafts: int | None  # num_speculative_tokens
    tree_size: int | None  # draft_tree_size: verify a tree of this many drafts, None: a chain
    lookup: PromptLookup | None  # prompt_lookup_num_tokens: graft a prompt-lookup branch onto the tree
    copy_ngram: int  # copy drafting (chain slots, or tree children): the shortest suffix matched (0: off)
    eos: set[int]
    pad_id: int
    criteria: list  # stopping criteria other than EOS and the length (stop strings, the caller's)
    prompt_rows: list[torch.Tensor]  # per row [P] its prompt ids (left padding included)
    generated: list[list[int]]  # per row the tokens committed so far (finished rows included)
    streamer: Any
    forward_kwargs: dict[str, Any]  # passed to every target forward: the cache and the caller's model kwargs
    keeps_logits: bool  # the target's forward takes logits_to_keep
    prompt_starts: list[int] | None = None  # per row its first prompt position after the left padding (prompt lookup)
    lookup_rates: LookupRates | None = None  # per row how often the target took the lookup branch's tokens
    copy_indexes: list[CopyIndex] | None = None  # per row the n-grams of its prompt and output (copy drafting, lookup)
    kept: _KeptOutputs | None = None  # output_scores / output_logits, when return_dict_in_generate asks for them

    @property
    def block_size(self) -> int:
        return self.drafter.config.block_size

    @property
    def verifies_tree(self) -> bool:
        return self.tree_size is not None or self.lookup is not None


@dataclass
class _Rows:
    """What changes from step to step: the R rows still running, in the order of the caches' batch dimension."""

    ids: list[int]  # [R] original row index of each running row
    anchor: torch.Tensor  # [R] the last committed token (its K/V is not in the caches yet)
    anchor_pos: torch.Tensor  # [R] its position
    ctx_valid: torch.Tensor  # [R, C] bool: the cache columns each row attends to (not padding, not a rejected draft)
    dense: bool  # every column is valid in every row: the target's forward needs no attention mask


@dataclass
class _Verified:
    """One verify forward over the ragged batch: row r scored [anchor, x_0..x_{l_r-1}]."""

    lengths: torch.Tensor  # [R] drafts verified per row, l_r
    width: int  # W = 1 + max l_r (1: a plain step)
    valid: torch.Tensor  # [R, W] bool: the anchor and each row's verified drafts
    mask: torch.Tensor  # [R, C + W] bool: the columns each row attended to (the next ctx_valid, rejections masked)
    logits: torch.Tensor  # [T, V] fp32: the target's logits after the anchor and after each verified draft, row by row
    caps: torch.Tensor | None = None  # [R] a tree's: the most drafts each row may accept (a chain's lengths obey them)


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
    draft_tree_size: int | None = None,
    copy_ngram: int | None = None,
    **model_kwargs: Any,
) -> torch.LongTensor | DSparkGenerateOutput:
    """DSpark speculative decoding; use as `model.generate(**enc, custom_generate=hf_dspark.generate, drafter=d)`.

    Args:
        input_ids: [N, P] left-padded prompts (`attention_mask` [N, P] among the model kwargs).
        drafter: a `DSparkDrafter` bound to `model` (`DSparkDrafter.from_pretrained(..., target=model)`).
        num_speculative_tokens: draft and verify at most this many of the block's B tokens (0: plain decoding).
        markov: False samples the block without the Markov head (pure DFlash on the same weights).
        confidence_threshold: verify drafts while the calibrated confidence stays >= this value.
        adaptive_verification: use the hardware-aware prefix scheduler (needs a step table; see step_table.py).
        verify_policy: any `hf_dspark.scheduler.VerifyPolicy` (overrides the three options above).
        draft_tree_size: verify the drafter's `draft_tree_size` most likely drafts, grown as a tree from the Markov
            head (`hf_dspark.draft_tree`), instead of one chain; every drafting step verifies the full tree (no
            scheduler). Greedy or sampled, the output stays plain decoding's. None: when none of the options above is
            given, the tree `default_tree_size` sizes from the device's step table for up to DEFAULT_TREE_MAX_ROWS
            prompts (block_size drafts without a table), else a chain.
            The generation config's `prompt_lookup_num_tokens` (and `max_matching_ngram_size`) graft a prompt-lookup
            branch onto the tree, or onto the drafter's best chain (`hf_dspark.prompt_lookup`).
        copy_ngram: copy drafting: where the last COPY_LONGEST_NGRAM (8) down to `copy_ngram` tokens (committed or
            just drafted; the longest first) occurred earlier in the prompt or output, the token that followed their
            latest occurrence is drafted next (`hf_dspark.prompt_lookup.CopyIndex`): in a chain instead of the
            drafter's pick, in a tree as one more child of every expanded node. 0 turns it off. None:
            DEFAULT_COPY_NGRAM (3) for chains of a set length (the full block, num_speculative_tokens); off where
            confidences size the chain (the scheduler, confidence_threshold: the confidence head does not see copies,
            so its calibration does not cover them) and for trees (their prompt-lookup branch follows the same rule
            from the anchor). Greedy or sampled, the output stays plain decoding's.
        dspark_streamer: a transformers streamer (`streamer=` is consumed by generate() before it reaches here).
        stop_strings, stop_tokenizer: stop strings, cut at the exact stop point inside an accepted block
            (generate() does not hand its tokenizer to a custom_generate callable, hence our own names).

    Returns the sequences `[N, P + new]` (finished rows padded), or a `DSparkGenerateOutput` with
    `dspark_stats` when `return_dict_in_generate=True`, and `scores` / `logits` as plain generate() returns them with
    `output_scores` / `output_logits` (a tuple of [N, V] per new token; a row that ended early holds zeros past its
    end). The stats are also left on `drafter.last_stats`.
    """
    if drafter is None:
        raise ValueError("hf_dspark.generate needs drafter=<DSparkDrafter>; load one with DSparkDrafter.from_pretrained(..., target=model).")
    drafter = unwrap_drafter(drafter)
    drafter.require_target(model)
    prepack_like(drafter, model)
    attention_mask = model_kwargs.pop("attention_mask", None)  # [N, P]
    policy_options = dict(verify_policy=verify_policy, confidence_threshold=confidence_threshold)
    policy_options.update(adaptive_verification=adaptive_verification)
    call = _start_call(
        model, drafter, input_ids, generation_config, logits_processor, stopping_criteria, stop_strings, stop_tokenizer,
        dspark_streamer, num_speculative_tokens, markov, policy_options, draft_tree_size, copy_ngram, model_kwargs,
    )
    if call.budget > 0:
        rows = _prefill(call, input_ids, attention_mask)
        while rows.ids:
            _decode_step(call, rows)
    return _finish(call, input_ids, generation_config)


def _start_call(
    model, drafter, input_ids, gen, logits_processor, stopping_criteria, stop_strings, stop_tokenizer, streamer,
    num_speculative_tokens, markov, policy_options, tree_size, copy_ngram, model_kwargs,
) -> _Call:
    """Check the inputs, read the generation config, choose the verify policy; what is left of `model_kwargs` goes
    to every target forward."""
    cache_key = cache_kwarg(model)
    cache = model_kwargs.pop(cache_key, None)
    cache = _check_inputs(model, drafter.config, gen, input_ids, num_speculative_tokens, cache)
    check_copy_ngram(copy_ngram)
    for name in ("past_key_values", "position_ids", "use_cache", "logits_to_keep"):
        model_kwargs.pop(name, None)
    n_rows, prompt_len = input_ids.shape
    max_length = int(gen.max_length) if gen.max_length is not None else prompt_len + 20
    eos_ids = getattr(gen, "_eos_token_tensor", None)
    eos = set(eos_ids.flatten().tolist()) if eos_ids is not None else set()
    pad_id = getattr(gen, "_pad_token_tensor", None)
    pad_id = int(pad_id) if pad_id is not None else (min(eos) if eos else 0)
    criteria = [c for c in (stopping_criteria or []) if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))]
    if stop_strings is not None:
        if stop_tokenizer is None:
            raise ValueError("stop_strings needs the tokenizer: pass stop_tokenizer=tokenizer (or tokenizer= with assistant_model=).")
        criteria.append(StopStringCriteria(stop_tokenizer, stop_strings))
    processing = Processing(logits_processor, bool(gen.do_sample), n_rows)
    policy = None
    if tree_size is None:
        policy = choose_policy(model, drafter, num_speculative_tokens=num_speculative_tokens, quiet=True, **policy_options)
        explicit = num_speculative_tokens is not None or any(v is not None for v in policy_options.values())
        tree_size = None if explicit else default_tree_size(model, drafter, policy, n_rows)
    lookup = PromptLookup.from_generation_config(gen, default_tokens=tree_size)  # a tree has a branch unless told 0
    if policy is not None and policy.fallback_reason and tree_size is None and lookup is None:  # a tree: no chain
        _log_fallback(policy.fallback_reason)
    if tree_size is not None or lookup is not None:  # every drafting step verifies the whole tree
        check_tree_call(model, drafter, tree_size, policy_options)
        policy = FullBlock(num_speculative_tokens)
    policy.reset()
    if streamer is not None and n_rows > 1:
        raise ValueError("Streaming supports one prompt at a time (like transformers' streamers); pass a single prompt.")
    if streamer is not None:
        streamer.put(input_ids.cpu())
    return _Call(
        model=model, drafter=drafter, cache=cache, context=DraftContext(drafter), policy=policy, processing=processing,
        stats=DSparkStats(block_size=drafter.config.block_size, tree_size=tree_size, lookup_tokens=lookup.num_tokens if lookup else None),
        do_sample=bool(gen.do_sample), markov=markov,
        budget=max_length - prompt_len, max_drafts=num_speculative_tokens, tree_size=tree_size, lookup=lookup,
        copy_ngram=_copy_ngram(copy_ngram, policy, tree_size),
        lookup_rates=LookupRates(n_rows) if lookup else None, eos=eos, pad_id=pad_id, criteria=criteria,
        prompt_rows=list(input_ids), generated=[[] for _ in range(n_rows)], streamer=streamer,
        forward_kwargs={cache_key: cache, **model_kwargs},
        keeps_logits=takes_logits_to_keep(model), kept=_KeptOutputs.for_call(gen, n_rows),
    )


def _target_forward(call: _Call, ids, mask, pos, last_only: bool = False) -> torch.Tensor:
    """One target forward over ids [R, T] at positions pos [R, T], appended to the cache -> logits [R, T, V] ([R, 1, V]
    with `last_only`); the taps of these tokens go to the drafter's context (projected when the drafter next runs).
    `mask` [R, C + T], a tree's 4D mask [R, 1, T, C + T] in the format of the target's attention (`tree_attention_mask`),
    or None when every column is valid in every row: like generate(), which drops an all-ones
    attention mask (given, it cost ~0.5 ms of a 61 ms batch-1 decode forward, bf16, 2-core CPU:
    `scripts/decode_overhead.py 1 bfloat16`)."""
    taps = call.drafter.tap_hidden_state_ids
    with grouped_kv_heads_under_masks(call.model, ids.shape[1]):  # a verify forward: no repeated K/V heads
        out = call.model(
            input_ids=ids,
            attention_mask=None if mask is None else mask if mask.dim() == 4 else mask.long(),
            position_ids=pos,
            use_cache=True,
            output_hidden_states=taps,
            **({"logits_to_keep": 1} if last_only and call.keeps_logits else {}),
            **call.forward_kwargs,
        )
    call.context.append([out.hidden_states[i] for i in taps], pos)  # m x [R, T, H]
    return out.logits


def _prefill(call: _Call, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> _Rows:
    """The target over the prompts [N, P] -> the first token of each row (committed); taps -> the drafter's context.
    Returns the rows still running."""
    attn = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()  # [N, P]
    positions = (attn.long().cumsum(-1) - 1).clamp(min=0)
    t0 = time.perf_counter()
    dense = bool(attn.all())  # no padding: no attention mask
    logits = _target_forward(call, input_ids, None if dense else attn, positions, last_only=True)[:, -1].float()  # [N, V]
    scores = call.processing(logits, lambda i: (i, call.prompt_rows[i]))  # [N, V]
    first = sample_rows(torch.softmax(scores, -1)) if call.do_sample else first_argmax(scores)
    call.stats.verify_time_s += time.perf_counter() - t0
    anchor_pos = attn.long().sum(-1)  # the first generated token's position, per row
    call.prompt_starts = (input_ids.shape[1] - anchor_pos).tolist()
    shortest = [n for n in (call.copy_ngram, call.lookup and call.lookup.shortest) if n]  # what the queries match
    if shortest:
        call.copy_indexes = [CopyIndex(p[s:].tolist(), min(shortest)) for p, s in zip(call.prompt_rows, call.prompt_starts)]
    rows = _Rows(list(range(input_ids.shape[0])), anchor=first, anchor_pos=anchor_pos, ctx_valid=attn.clone(), dense=dense)
    outputs = (scores, logits, [[i] for i in rows.ids]) if call.kept is not None else None
    active = _append_tokens(call, rows.ids, [[int(t)] for t in first], outputs)
    _drop_finished(call, rows, active)
    return rows


def _decode_step(call: _Call, rows: _Rows) -> None:
    """One step of the R running rows: choose the depth, draft, verify, accept, commit; the policy sees what it cost."""
    step_start, num_rows = time.perf_counter(), len(rows.ids)
    prefix = _prefix_reader(call, rows.ids)
    depth, caps = _choose_depth(call, rows)
    draft, draft_seconds, catch_up = _draft(call, rows, depth, caps, prefix)
    verified = _verify(call, rows, draft, depth, caps)
    emitted, num_acc, order, scores = _accept(call, draft, verified, prefix)
    if draft.branches is not None:
        call.lookup_rates.observe(rows.ids, draft.branches, emitted)
    accepted = num_acc.tolist() if verified.width > 1 else [0] * num_rows
    call.stats.record_step(depth, draft.conf_logits, verified.lengths, verified.width, num_acc, accepted)
    _commit(call, rows, verified, emitted, num_acc, accepted, order, scores)
    step_seconds = time.perf_counter() - step_start
    call.stats.step_seconds.append(step_seconds)
    t0 = time.perf_counter()
    accepted_drafts = num_acc if depth > 0 else None
    call.policy.observe_step(num_rows, depth, step_seconds, draft_seconds, accepted_drafts, catch_up=catch_up)
    call.stats.policy_time_s += time.perf_counter() - t0


def _prefix_reader(call: _Call, row_ids: list[int]):
    """(running row i, drafts [k]) -> (original row, prompt + generated + drafts [P + G + k]), for logits processors
    that read the prefix; a row's generated tokens become a tensor once per step, when first asked for."""
    generated: dict[int, torch.Tensor] = {}

    def prefix(i: int, drafts: torch.Tensor) -> tuple[int, torch.Tensor]:
        row = row_ids[i]
        prompt = call.prompt_rows[row]
        if row not in generated:
            generated[row] = torch.tensor(call.generated[row], dtype=torch.long, device=prompt.device)
        return row, torch.cat([prompt, generated[row], drafts])

    return prefix


def _choose_depth(call: _Call, rows: _Rows) -> tuple[int, list[int]]:
    """How many drafts to make this step (0: a plain target step, no drafter pass), and per row the most it may
    verify: never more than it can still emit, nor num_speculative_tokens."""
    caps = [max(call.budget - len(call.generated[r]) - 1, 0) for r in rows.ids]
    if call.max_drafts is not None:
        caps = [min(c, call.max_drafts) for c in caps]
    t0 = time.perf_counter()
    pending = call.context.num_pending  # context columns the drafter has not projected yet
    depth = call.policy.draft_depth(len(rows.ids), call.block_size, usable=caps, pending_columns=pending)
    call.stats.policy_time_s += time.perf_counter() - t0
    return min(depth, max(caps)), caps


def _draft(call: _Call, rows: _Rows, depth: int, caps: list[int], prefix) -> tuple[Draft, float, tuple[int, float] | None]:
    """One drafter pass, `depth` slots deep (none at depth 0) -> the drafts, the seconds they took, and the catch-up:
    (request-columns, seconds) of projecting the context columns that plain steps or the prefill left, when
    `catch_up_columns` says it counts apart."""
    n, device = len(rows.ids), rows.anchor.device
    t0 = time.perf_counter()
    catch_up = None
    if depth > 0:
        pending = call.context.num_pending
        ctx_kv = call.context.kv()
        if catch_up_columns(pending, call.block_size):
            _synchronize(device)
            catch_up = (n * pending, time.perf_counter() - t0)
        args = (rows.anchor, rows.anchor_pos, ctx_kv, rows.ctx_valid, call.processing, prefix, call.markov, depth)
        copy = _copy_reader(call, rows.ids)
        if call.verifies_tree:
            draft = _draft_tree(call, args, depth, caps, rows.ids, copy)
        else:
            draft = drafting.draft_block(call.drafter, *args, copy=copy)
        _synchronize(device)  # the policy prices drafting with this wall time
        call.stats.drafted_steps += 1
    else:  # a plain target step: the policy judged that drafting does not pay
        draft = Draft(tokens=torch.empty((n, 0), dtype=torch.long, device=device), q=None, conf_logits=None)
    seconds = time.perf_counter() - t0
    call.stats.draft_time_s += seconds
    return draft, seconds, catch_up


def _copy_ngram(copy_ngram: int | None, policy: VerifyPolicy, tree_size: int | None) -> int:
    """The call's copy drafting (0: off): as asked, else on for chains of a set length only (a policy that reads
    calibrated confidences sizes chains from a head that does not see copies; in a tree, copies added 3% to the tau
    its lookup branch reaches, and cost about as much in drafting time: bench_results/s56)."""
    if copy_ngram is not None:
        return copy_ngram
    return 0 if policy.needs_confidence or tree_size is not None else DEFAULT_COPY_NGRAM


def _copy_index(call: _Call, row: int) -> CopyIndex:
    """The row's index of its prompt and committed tokens, brought up to date."""
    index = call.copy_indexes[row]
    index.follow(call.generated[row])
    return index


def _copy_reader(call: _Call, row_ids: list[int]):
    """(running row i, its drafts so far as a list) -> the token copy drafting puts after them (None: the drafter's
    pick), or None when copy drafting is off."""
    if not call.copy_ngram:
        return None

    def copy(i: int, drafts: list[int]) -> int | None:
        return _copy_index(call, row_ids[i]).copied(drafts, call.copy_ngram)

    return copy


def _draft_tree(call: _Call, args: tuple, depth: int, caps: list[int], row_ids: list[int], copy) -> Draft:
    """The drafter's tree of draft_tree_size nodes (its best chain without one), with the prompt-lookup branch of
    each row grafted on when prompt_lookup_num_tokens is set."""
    size, top_k = (call.tree_size, TREE_TOP_K) if call.tree_size is not None else (depth, 1)
    draft = drafting.draft_tree(call.drafter, *args, size=size, top_k=top_k, copy=copy, copy_logprob=math.log(TREE_COPY_RATE))
    if call.lookup is None:
        return draft
    branches, rates = [], []
    for row, cap in zip(row_ids, caps):
        branches.append(call.lookup.propose(_copy_index(call, row), cap, device=draft.tokens.device))
        rates.append(call.lookup_rates.token_logprob(row))
    tree = graft_branch(draft.tree, branches, size=call.tree_size, token_logprob=rates)
    return Draft(tokens=tree.tokens, q=None, conf_logits=None, tree=tree, branches=branches)


def _verify(call: _Call, rows: _Rows, draft: Draft, depth: int, caps: list[int]) -> _Verified:
    """How many drafts each row verifies (the policy's lengths, capped), then one target forward over the ragged
    batch. A plain step (no row verifies a draft) scores one position per row, without the ragged layout."""
    n, device = len(rows.ids), rows.anchor.device
    if draft.tree is not None:
        return _verify_tree(call, rows, draft, torch.tensor(caps, device=device))
    t0 = time.perf_counter()
    width = 1
    if depth > 0:
        lengths = call.policy.lengths(draft.conf_logits, depth, num_requests=n).to(device)
        lengths = torch.minimum(lengths, torch.tensor(caps, device=device))
        call.stats.policy_time_s += time.perf_counter() - t0
        width = int(lengths.max()) + 1
    t0 = time.perf_counter()
    if width == 1:
        lengths = torch.zeros(n, dtype=torch.long, device=device)
        valid = torch.ones((n, 1), dtype=torch.bool, device=device)
        ids, pos = rows.anchor[:, None], rows.anchor_pos[:, None]
    else:
        ids, pos, valid = build_verify_inputs(rows.anchor, draft.tokens, lengths, rows.anchor_pos, call.pad_id)
    mask = torch.cat([rows.ctx_valid, valid], dim=1)  # [R, C + W]
    rows.dense = rows.dense and (width == 1 or bool(valid.all()))
    logits = _target_forward(call, ids, None if rows.dense else mask, pos).float()  # [R, W, V]
    flat = flatten_ragged(logits, lengths)  # [T, V]
    call.stats.verify_time_s += time.perf_counter() - t0
    return _Verified(lengths=lengths, width=width, valid=valid, mask=mask, logits=flat)


def _verify_tree(call: _Call, rows: _Rows, draft: Draft, caps: torch.Tensor) -> _Verified:
    """One target forward over [anchor, tree nodes] per row, each node attending to the context, the anchor and its
    ancestors, at position anchor + its level + 1."""
    t0 = time.perf_counter()
    tree = draft.tree
    n, size = tree.tokens.shape
    ids = torch.cat([rows.anchor[:, None], tree.tokens.clamp(min=0)], 1)  # [R, W] (padding nodes read token 0)
    pos = rows.anchor_pos[:, None] + torch.cat([tree.levels.new_zeros((n, 1)), tree.levels + 1], 1)  # [R, W]
    valid = torch.ones_like(ids, dtype=torch.bool)
    mask4d = tree_attention_mask(call.model, rows.ctx_valid, ancestor_mask(tree.parents))  # [R, 1, W, C + W]
    logits = _target_forward(call, ids, mask4d, pos).float()  # [R, W, V]
    call.stats.verify_time_s += time.perf_counter() - t0
    lengths = (tree.tokens != NO_NODE).sum(1)  # [R] real nodes
    mask = torch.cat([rows.ctx_valid, valid], dim=1)
    return _Verified(lengths=lengths, width=size + 1, valid=valid, mask=mask, logits=logits.reshape(-1, logits.shape[-1]), caps=caps)


TREE_ATTENTION = ("sdpa", "eager")  # attention implementations that take a 4D mask as is
# the default tree is kept off where the step table prices a step over the full block's width above this many
# plain steps: there verifying every node at every step costs more than the scheduler's shorter chains
DEFAULT_TREE_MAX_STEP_COST = 2.0
# a batch of more prompts verifies chains by default: a tree drafts at every step, and per row its drafting, lookup and
# acceptance cost more than the step table sees. Bf16 on a 2-core AMX CPU (bench_results/s43), the tree of 7 with its
# lookup branch against the scheduler's chains, GSM8K / HumanEval / MT-Bench: 2.03x / 1.94x / 1.34x against 1.76x /
# 1.38x / 1.02x of plain generate() at 2 rows, 1.61x / 1.41x / 1.04x against 1.25x / 1.25x / 1.00x at 4, but 1.46x /
# 1.07x / 0.91x against 1.33x / 0.89x / 1.00x at 8, where the scheduler drafted nothing on MT-Bench and the tree lost.
# With the scheduler's opening probe (bench_results/s45, 24 prompts per set): 1.32-1.37x / 1.43-1.45x / 0.99-1.03x
# against 1.12x / 0.99x / 0.98x at 6 rows; at 8, 1.23-1.25x / 1.34-1.35x / 0.89-0.94x against 1.10x / 1.06x / 0.97x.
# Once verify forwards kept grouped K/V heads under their masks (hf_dspark.attention, session 46; bench_results/s46):
# at 7 rows 1.30x / 1.49x / 1.07x against 1.14x / 1.08x / 1.02x, at 8 1.45x / 1.50x / 1.06x and 1.29x / 1.19x / 1.17x
# against 1.11x / 1.23x / 0.98x and 1.18x / 1.06x / 0.98x; at 12, 1.05x / 1.26x / 0.90x against 1.01x / 1.08x / 0.96x.
DEFAULT_TREE_MAX_ROWS = 8
# tau of a best-first draft tree grows about as the log of its size N: 1 + TREE_TAU_GROWTH * ln(N / block_size) times
# the tree of block_size's. Measured with the shipped SmolLM2 drafter (bf16, greedy, 40 prompts each of GSM8K,
# HumanEval and MT-Bench), the drafter's nodes alone: 1.05 / 1.09 / 1.11 / 1.15 at N = 10 / 13 / 16 / 20 against N = 7
# (bench_results/s41). With a prompt-lookup branch among the nodes tau grows faster (1.12 / 1.21 at N = 11 / 16,
# bench_results/s42), but there a tree step wider than 12 tokens cost more than the step table prices it (trees of
# 16 and 28 timed slower than 11 on a 2-core AMX CPU), so the sizing keeps the drafter's own growth.
TREE_TAU_GROWTH = 0.14


def default_tree_size(model: PreTrainedModel, drafter: DSparkDrafter, policy: VerifyPolicy, num_rows: int = 1) -> int | None:
    """The tree each of `num_rows` prompts verifies when the call names no verify option (README, "Draft trees").

    With the device's step table (the scheduler's, `policy`, at `num_rows` requests): the size N in
    block_size..block_size * TREE_TOP_K (num_rows * (N + 1) within the table's probes) whose expected tokens per
    second, tau(N) (`TREE_TAU_GROWTH`) times the table's steps per second at num_rows * (N + 1) tokens, is highest, so a
    device that verifies 16 tokens at about the price of 8 verifies a wider tree; None (the chosen chain policy) where
    a step of num_rows * (block_size + 1) tokens costs more than DEFAULT_TREE_MAX_STEP_COST plain steps of the rows.
    Without a table: block_size drafts (the full block's verify width with more of it accepted). None where the
    target's attention cannot take a tree mask, or for more than DEFAULT_TREE_MAX_ROWS prompts."""
    if model.config._attn_implementation not in TREE_ATTENTION or num_rows > DEFAULT_TREE_MAX_ROWS:
        return None
    size = drafter.config.block_size
    if not isinstance(policy, AdaptiveVerification):
        return size
    table = policy.costs.table.for_num_requests(num_rows)
    last_probe = table.sample_batch_tokens[-1]
    if num_rows * (size + 1) > last_probe:  # the table prices no tree this wide
        return None
    if table.steps_per_sec(num_rows) > DEFAULT_TREE_MAX_STEP_COST * table.steps_per_sec(num_rows * (size + 1)):
        return None
    most = min(size * TREE_TOP_K, last_probe // num_rows - 1)  # past its last probe a table prices no width
    sizes = torch.arange(size, most + 1)  # [S] candidate tree sizes (most >= size: the check above)
    tokens_per_step = 1 + TREE_TAU_GROWTH * torch.log(sizes / size)  # [S] tau relative to the tree of block_size
    seconds = table.seconds_interpolated(num_rows * (sizes + 1))  # [S] a verify step of N + 1 tokens per row
    return int(sizes[torch.argmax(tokens_per_step / seconds)])  # the smallest of equals


def tree_attention_mask(model: PreTrainedModel, ctx_valid: torch.Tensor, tree: torch.Tensor) -> torch.Tensor:
    """ctx_valid [R, C] and a tree's ancestor mask [R, W, W] -> [R, 1, W, C + W]: bool for SDPA, additive (0 or the
    dtype's minimum) for eager attention."""
    width = tree.shape[1]
    full = torch.cat([ctx_valid[:, None, :].expand(-1, width, -1), tree], dim=-1)[:, None]
    if model.config._attn_implementation == "sdpa":
        return full
    dtype = model.dtype
    return torch.zeros(full.shape, dtype=dtype, device=full.device).masked_fill_(~full, torch.finfo(dtype).min)


def check_tree_call(model: PreTrainedModel, drafter: DSparkDrafter, size: int | None, policy_options: dict) -> None:
    """A draft tree (draft_tree_size, or the chain with a prompt-lookup branch) is verified whole at every drafting
    step, through a 4D attention mask."""
    check_draft_tree_size(size, drafter.config.block_size)
    chosen = [k for k, v in policy_options.items() if v not in (None, False)]
    if chosen:
        raise ValueError(
            f"draft_tree_size and prompt_lookup_num_tokens verify the whole tree at every drafting step; they cannot be "
            f"combined with {', '.join(chosen)}."
        )
    impl = model.config._attn_implementation
    if impl not in TREE_ATTENTION:
        raise ValueError(
            f"draft_tree_size and prompt_lookup_num_tokens need a tree attention mask, which "
            f"attn_implementation={impl!r} cannot take; load the target with attn_implementation='sdpa' (or 'eager'), "
            "or drop them."
        )


def _accept(call: _Call, draft: Draft, verified: _Verified, prefix) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Greedy match or rejection sampling (SPEC section 3) on the flat ragged layout -> emitted [R, W] (row r: its
    accepted drafts, then the recovered or bonus token, then -1), num_acc [R], the accepted drafts a_r, the
    verify slots' new order (a tree's; None for a chain) and the processed scores [T, V] the tokens came from."""
    if draft.tree is not None:
        return _accept_tree(call, draft, verified, prefix)
    t0 = time.perf_counter()
    width, valid, device = verified.width, verified.valid, verified.logits.device
    cu = build_cu_num_draft(verified.lengths)  # [R + 1] cumulative draft counts
    draft_ids = draft.tokens[:, : width - 1][valid[:, 1:]] if width > 1 else draft.tokens[:, :0].reshape(0)  # [sum l_r]
    flat_prefix = None
    if call.processing.reads_prefix:
        flat_slots = valid.nonzero().tolist()  # [T] of (row, slot)
        flat_prefix = lambda j: prefix(flat_slots[j][0], draft.tokens[flat_slots[j][0], : flat_slots[j][1]])
    scores = call.processing(verified.logits, flat_prefix)  # [T, V]
    if call.do_sample:
        target_probs = torch.softmax(scores, dim=-1)
        draft_probs = draft.q[:, : width - 1][valid[:, 1:]] if draft.q is not None else None  # [sum l_r, V]
        uniforms = torch.rand(draft_ids.shape[0], device=device)
        noise = exp_noise(valid.shape[0], target_probs.shape[1], device=device)  # [R, V]
        emitted, num_acc = rejection_sample(target_probs, draft_ids, draft_probs, cu, uniforms, noise, greedy=False)
    else:
        emitted, num_acc = rejection_sample(scores, draft_ids, None, cu, None, None, greedy=True)
    call.stats.verify_time_s += time.perf_counter() - t0
    return emitted, num_acc, None, scores


def _accept_tree(call: _Call, draft: Draft, verified: _Verified, prefix) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Walk the tree with the target's token at each node (its greedy choice, or one draw from its processed
    distribution when sampling) -> emitted, num_acc and the verify slots' new order (the accepted path first)."""
    t0 = time.perf_counter()
    tree = draft.tree
    n, width = tree.tokens.shape[0], verified.width
    flat_prefix = None
    if call.processing.reads_prefix:
        paths = _tree_paths(tree)
        flat_prefix = lambda j: prefix(j // width, paths[j // width][j % width])
    scores = call.processing(verified.logits, flat_prefix)  # [R * W, V]
    if call.do_sample:  # one draw at each slot the walk reaches (torch.multinomial over all R x W slots cost 24 ms of
        # a batch-4 step, bf16, 2-core CPU: its exponential noise; `sample_index` draws a 49k row in 0.06 ms)
        probs = torch.softmax(scores, dim=-1)  # [R * W, V]
        if probs.device.type == "cpu":
            choice = lambda row, slot: sample_index(probs[row * width + slot])  # noqa: E731
        else:  # a GPU draws every slot at once (a draw per slot reached would sync the device each time)
            choice = torch.multinomial(probs, 1).view(n, width)  # [R, W]
    else:
        choice = first_argmax(scores).view(n, width)
    emitted, num_acc, order = accept_tree(tree, choice, verified.caps)
    call.stats.verify_time_s += time.perf_counter() - t0
    return emitted, num_acc, order, scores


def _tree_paths(tree) -> list[list[torch.Tensor]]:
    """Per row, per verify slot: the drafts from the anchor to that slot's token, excluded (the slot's prefix)."""
    out = []
    for parents, tokens in zip(tree.parents.tolist(), tree.tokens.clamp(min=0)):  # padding nodes read token 0
        paths = [tokens[:0]]  # the anchor's slot: no drafts before the token after it
        for j, p in enumerate(parents):  # node j sits in slot j + 1; its parent's slot p comes first
            paths.append(torch.cat([paths[p], tokens[j : j + 1]]))
        out.append(paths)
    return out


def _reorder_tail(call: _Call, order: torch.Tensor, num_acc: torch.Tensor) -> None:
    """Move each row's accepted path (the first num_acc + 1 slots of order [R, W]) to the front of the last W cache
    columns, in the target's cache and the drafter's context; nothing moves when every path is already in front."""
    width, path = order.shape[1], order[:, : int(num_acc.max()) + 1]  # [R, m]
    if bool((path == torch.arange(path.shape[1], device=path.device)).all()):
        return
    reorder_last([t for layer in call.cache.layers for t in (layer.keys, layer.values)], path, width)
    call.context.reorder_tail(path, width)


def _commit(call: _Call, rows: _Rows, verified: _Verified, emitted, num_acc, accepted: list[int], order, scores) -> None:
    """Commit each row's a_r + 1 tokens (cut at EOS / stop strings / max_new_tokens), roll the caches back to
    [anchor + accepted drafts] (rejected drafts become masked holes; a tree's verify slots are first reordered by
    `order` [R, W], its accepted path first), drop finished rows, crop / compact holes. `scores` [T, V]: the
    processed scores the tokens came from (kept when return_dict_in_generate asks for them)."""
    n, width = len(rows.ids), verified.width
    chunks = [e[: a + 1] for e, a in zip(emitted.tolist(), accepted)]
    outputs = None
    if call.kept is not None:
        outputs = (scores, verified.logits, _score_rows(verified, order, accepted))
    if order is not None:
        _reorder_tail(call, order, num_acc)
    active = _append_tokens(call, rows.ids, chunks, outputs)
    rows.ctx_valid = verified.mask
    if width > 1:
        slot = torch.arange(width, device=num_acc.device)  # [W]: 0 = the anchor, k = draft k - 1
        rows.ctx_valid[:, -width:] &= slot[None, :] <= num_acc[:, None]  # the anchor and the accepted drafts stay valid
        rows.anchor = emitted[torch.arange(n, device=num_acc.device), num_acc]
        rows.anchor_pos = rows.anchor_pos + num_acc + 1
    else:
        rows.anchor, rows.anchor_pos = emitted[:, 0], rows.anchor_pos + 1
    _drop_finished(call, rows, active)
    if width > 1 or not all(active):  # a plain step of the same rows adds no holes: nothing to crop or compact
        rows.ctx_valid = _trim(call.cache, call.context, rows.ctx_valid)
        rows.dense = bool(rows.ctx_valid.all())


def _score_rows(verified: _Verified, order: torch.Tensor | None, accepted: list[int]) -> list[list[int]]:
    """Per running row, the rows of the step's flat scores [T, V] its emitted tokens were chosen from: a chain's row
    r scored its anchor and its l_r drafts in turn; a tree's accepted path is `order`'s first slots."""
    if order is not None:
        width = verified.width
        return [[r * width + s for s in slots[: a + 1]] for r, (slots, a) in enumerate(zip(order.tolist(), accepted))]
    starts = torch.cumsum(verified.lengths + 1, 0) - (verified.lengths + 1)  # [R] each row's first flat row
    return [list(range(s, s + a + 1)) for s, a in zip(starts.tolist(), accepted)]


def _append_tokens(call: _Call, row_ids: list[int], chunks: list[list[int]], outputs=None) -> list[bool]:
    """Append each row's emitted tokens, cut at EOS / max_new_tokens / other stopping criteria -> active, per row.
    `outputs` (scores [M, V], raw logits [M, V], per row the rows of its tokens there): kept for what is committed."""
    active = []
    for i, (r, chunk) in enumerate(zip(row_ids, chunks)):
        out = call.generated[r]
        start, done = len(out), False
        for tok in chunk:
            out.append(tok)
            done = tok in call.eos or len(out) >= call.budget
            if not done and call.criteria:
                seq = torch.cat([call.prompt_rows[r], torch.tensor(out, device=call.prompt_rows[r].device)])[None]
                done = any(bool(c(seq, None).any()) for c in call.criteria)
            if done:
                break
        if outputs is not None:
            call.kept.add(r, outputs[2][i][: len(out) - start], outputs[0], outputs[1])
        if call.streamer is not None:
            call.streamer.put(torch.tensor(out[start:]))
        active.append(not done)
    return active


def _drop_finished(call: _Call, rows: _Rows, active: list[bool]) -> None:
    """Drop finished rows from every piece of state (finished rows stop costing compute)."""
    if all(active):
        return
    if not any(active):  # the call is over: leave the caches (selecting no row still merged every pending tap: ~15 ms at batch 64)
        rows.ids, rows.anchor, rows.anchor_pos, rows.ctx_valid = [], rows.anchor[:0], rows.anchor_pos[:0], rows.ctx_valid[:0]
        return
    keep = [i for i, a in enumerate(active) if a]
    idx = torch.tensor(keep, dtype=torch.long, device=rows.anchor.device)
    call.cache.batch_select_indices(idx)
    call.context.select(idx)
    rows.ids = [rows.ids[i] for i in keep]
    rows.anchor, rows.anchor_pos, rows.ctx_valid = rows.anchor[idx], rows.anchor_pos[idx], rows.ctx_valid[idx]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def _finish(call: _Call, input_ids: torch.Tensor, gen: Any) -> torch.LongTensor | DSparkGenerateOutput:
    """The sequences [N, P + new] (rows that finished early padded), the stats on the drafter."""
    if call.streamer is not None:
        call.streamer.end()
    width = max((len(g) for g in call.generated), default=0)
    new = torch.full((len(call.generated), width), call.pad_id, dtype=torch.long, device=input_ids.device)
    for r, g in enumerate(call.generated):
        if g:
            new[r, : len(g)] = torch.tensor(g, device=input_ids.device)
    sequences = torch.cat([input_ids, new], dim=1)
    call.drafter.last_stats = call.stats
    if getattr(gen, "return_dict_in_generate", False):
        kept = call.kept.per_step(width) if call.kept is not None else {}
        return DSparkGenerateOutput(sequences=sequences, dspark_stats=call.stats, **kept)
    return sequences


def as_drafter(obj: Any) -> DSparkDrafter | None:
    """The DSparkDrafter itself, or the one inside a PEFT model (LoRA layers stay active); else None."""
    if isinstance(obj, DSparkDrafter):
        return obj
    base = getattr(getattr(obj, "base_model", None), "model", None)
    return base if isinstance(base, DSparkDrafter) else None


def unwrap_drafter(drafter: Any) -> DSparkDrafter:
    """Accept a PEFT-wrapped drafter (PeftModel around a DSparkDrafter)."""
    if (base := as_drafter(drafter)) is not None:
        return base
    raise TypeError(f"drafter must be a DSparkDrafter (or a PEFT model wrapping one), got {type(drafter).__name__}.")
