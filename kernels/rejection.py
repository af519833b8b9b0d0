"""Speculative-decoding verification on the flat ragged layout: accept / reject / recover / bonus.

Vocabulary (as in the vLLM v1 rejection sampler):
- draft tokens x_0..x_{l_r-1} of request r were proposed by the drafter with distributions q_k;
- the target scored them: p_0..p_{l_r} (one more row than drafts: the row after the last draft);
- x_k is *accepted* with probability min(1, p_k(x_k) / q_k(x_k)) while every earlier one was;
- at the first rejection j a *recovered* token is drawn from normalize(max(0, p_j - q_j));
- when all l_r drafts are accepted a *bonus* token is drawn from p_{l_r}.
Each request therefore emits num_accepted + 1 tokens. The output distribution equals sampling
from the target token by token (SPEC section 3). Greedy mode is the one-hot special case.

Randomness is passed in (``uniforms`` for the accept tests, ``exp_noise`` for the one recovered or
bonus token per request), so both backends give identical tokens on identical inputs and callers
keep per-request generators. argmax_v w(v) / E(v) with E(v) ~ Exp(1) i.i.d. is an exact sample from
w / sum(w) (the exponential race), so no normalisation is needed.

Layout: R requests; request r verifies l_r >= 0 drafts; cu_num_draft = [0, l_0, l_0+l_1, ...];
D = sum l_r draft rows; T = D + R target rows, request r's rows start at cu_num_draft[r] + r.
"""

from __future__ import annotations

import torch

from .argmax import first_argmax
from .dispatch import (HAS_TRITON, check, check_cu_num_draft, check_rows_sum_to_one, check_token_range,
                       debug_enabled, next_pow2, num_programs_target, select_backend, tl, triton)


def rejection_sample(
    target_probs: torch.Tensor,            # [T, V] target probabilities (greedy: logits are fine)
    draft_token_ids: torch.Tensor,         # [D] int64
    draft_probs: torch.Tensor | None,      # [D, V] or None (one-hot drafts)
    cu_num_draft: torch.Tensor,            # [R + 1] int64, cumulative draft counts from 0
    uniforms: torch.Tensor | None,         # [D] in [0, 1); None in greedy mode
    exp_noise: torch.Tensor | None,        # [R, V] i.i.d. Exp(1); None in greedy mode
    greedy: bool,
    *,
    backend: str | None = None,
    debug: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify every request's drafts; returns (output_tokens [R, max_l + 1] int64 padded with -1,
    num_accepted [R] int64). Row r holds the accepted drafts, then the recovered or bonus token."""
    R = cu_num_draft.numel() - 1
    D = draft_token_ids.numel()
    if uniforms is None and D == 0 and not greedy:      # nothing to accept: a plain decode step
        uniforms = torch.empty(0, dtype=torch.float32, device=target_probs.device)
    _check_shapes(target_probs, draft_token_ids, draft_probs, cu_num_draft, uniforms, exp_noise, greedy)
    if debug_enabled(debug):
        _check_values(target_probs, draft_token_ids, draft_probs, cu_num_draft, uniforms, exp_noise, greedy)
    device = target_probs.device
    if R <= 0:
        return (torch.empty((0, 1), dtype=torch.long, device=device),
                torch.empty((0,), dtype=torch.long, device=device))
    if D == 0:  # a plain decode step (no drafts): the target's own token, without the ragged bookkeeping
        final = first_argmax(target_probs if greedy else target_probs.float() / exp_noise.float())
        return final[:, None], torch.zeros(R, dtype=torch.long, device=device)
    max_l = int((cu_num_draft[1:] - cu_num_draft[:-1]).max())
    args = (target_probs, draft_token_ids, draft_probs, cu_num_draft, uniforms, exp_noise, greedy, max_l)
    if select_backend(backend, target_probs, draft_token_ids, draft_probs, cu_num_draft, uniforms,
                       exp_noise) == "triton":
        return _rejection_sample_triton(*args)
    return _rejection_sample_torch(*args)


def _check_shapes(target_probs, draft_token_ids, draft_probs, cu_num_draft, uniforms, exp_noise, greedy):
    check(cu_num_draft.dim() == 1 and cu_num_draft.numel() >= 1,
          "cu_num_draft must be a 1-D [R + 1] tensor; build it with build_cu_num_draft(num_verify).")
    check(target_probs.dim() == 2, "target_probs must be [T, V]; flatten the verify rows with flatten_ragged.")
    R = cu_num_draft.numel() - 1
    T, V = target_probs.shape
    D = draft_token_ids.numel()
    check(draft_token_ids.dim() == 1, "draft_token_ids must be a flat [D] tensor in request order.")
    check(T == D + max(R, 0),
          f"target_probs has {T} rows but {D} drafts over {R} requests need {D + R} (l_r + 1 per request); "
          f"pass one target row per draft plus one per request.")
    if draft_probs is not None:
        check(tuple(draft_probs.shape) == (D, V),
              f"draft_probs is {tuple(draft_probs.shape)} but must be [D, V] = [{D}, {V}]; "
              f"pass one draft distribution per draft token, or None for one-hot drafts.")
    if not greedy:
        check(uniforms is not None and exp_noise is not None,
              "sampled verification needs uniforms [D] and exp_noise [R, V]; pass them or set greedy=True.")
        check(uniforms.numel() == D,
              f"uniforms holds {uniforms.numel()} values but there are {D} drafts; pass one uniform per draft.")
        check(tuple(exp_noise.shape) == (R, V),
              f"exp_noise is {tuple(exp_noise.shape)} but must be [R, V] = [{R}, {V}]; pass one row per request.")


def _check_values(target_probs, draft_token_ids, draft_probs, cu_num_draft, uniforms, exp_noise, greedy):
    check_cu_num_draft(cu_num_draft, draft_token_ids.numel())
    check_token_range(draft_token_ids, target_probs.shape[1], "draft_token_ids")
    if not greedy:
        check_rows_sum_to_one(target_probs, "target_probs")
        if draft_probs is not None:
            check_rows_sum_to_one(draft_probs, "draft_probs")
        if uniforms.numel():
            check(bool(((uniforms >= 0) & (uniforms < 1)).all()),
                  "uniforms must lie in [0, 1); draw them with torch.rand.")
        if exp_noise.numel():
            check(bool((exp_noise > 0).all()),
                  "exp_noise must be positive Exp(1) samples; draw them with hf_dspark.kernels.exp_noise(...).")


# --------------------------------------------------------------------------------------------
# torch reference (vectorised over requests; also the CPU fast path)
# --------------------------------------------------------------------------------------------

def _rejection_sample_torch(target_probs, draft_token_ids, draft_probs, cu_num_draft, uniforms, exp_noise,
                            greedy, max_l):
    device = target_probs.device
    R = cu_num_draft.numel() - 1
    D = draft_token_ids.numel()
    cu = cu_num_draft.to(device=device, dtype=torch.long)
    num_draft = cu[1:] - cu[:-1]                                                   # [R]
    requests = torch.arange(R, device=device)
    req = torch.repeat_interleave(requests, num_draft, output_size=D)               # [D]
    draft_index = torch.arange(D, device=device)
    pos = draft_index - cu[:-1][req]                                               # [D] k within request
    rows = draft_index + req                                                       # [D] target row of draft
    x = draft_token_ids.long()

    if greedy:
        target_argmax = first_argmax(target_probs)                                 # [T]
        accepted = target_argmax[rows] == x
    else:
        p_x = target_probs[rows, x].float()
        q_x = draft_probs[draft_index, x].float() if draft_probs is not None else torch.ones_like(p_x)
        accepted = uniforms.float() * q_x < p_x

    # first rejected position per request (l_r when every draft is accepted)
    first_reject = torch.where(accepted, num_draft[req], pos)
    num_accepted = num_draft.scatter_reduce(0, req, first_reject, reduce="amin", include_self=True)

    final_row = cu[:-1] + requests + num_accepted                                 # [R]
    if greedy:
        final = target_argmax[final_row]
    else:
        weights = target_probs[final_row].float()                                  # [R, V]
        rejected = num_accepted < num_draft
        if D:
            d = (cu[:-1] + num_accepted).clamp(max=D - 1)                          # draft row at rejection
            if draft_probs is not None:
                residual = (weights - draft_probs[d].float()).clamp_min(0)
            else:
                residual = weights.scatter(1, x[d, None], 0.0)
            weights = torch.where(rejected[:, None], residual, weights)
        final = first_argmax(weights / exp_noise.float())

    out = torch.full((R, max_l + 1), -1, dtype=torch.long, device=device)
    keep = pos < num_accepted[req]
    out[req[keep], pos[keep]] = x[keep]
    out[requests, num_accepted] = final
    return out, num_accepted


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------

def _vocab_split(V: int, rows: int, device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_V, tiles per program, splits S) so that rows * S programs fill the device."""
    block_v = 1024 if device.type == "cuda" else 128
    n_tiles = triton.cdiv(V, block_v)
    splits = min(n_tiles, max(1, triton.cdiv(num_programs_target(device), max(rows, 1))))
    tiles = triton.cdiv(n_tiles, splits)
    return block_v, tiles, triton.cdiv(n_tiles, tiles)


def _rejection_sample_triton(target_probs, draft_token_ids, draft_probs, cu_num_draft, uniforms, exp_noise,
                             greedy, max_l):
    device = target_probs.device
    R = cu_num_draft.numel() - 1
    V = target_probs.shape[1]
    target_probs = target_probs.contiguous()
    cu = cu_num_draft.to(device=device, dtype=torch.long).contiguous()
    # never hand Triton an empty tensor (its pointer may be null); masks keep these unread
    placeholder = torch.zeros(1, dtype=torch.float32, device=device)
    draft_ids = draft_token_ids.long().contiguous() if draft_token_ids.numel() else placeholder.long()
    has_q = draft_probs is not None and draft_probs.numel() > 0
    q = draft_probs.contiguous() if has_q else placeholder
    u = uniforms.contiguous() if uniforms is not None and uniforms.numel() else placeholder
    noise = exp_noise.contiguous() if exp_noise is not None else placeholder

    out = torch.empty((R, max_l + 1), dtype=torch.long, device=device)
    num_accepted = torch.empty((R,), dtype=torch.long, device=device)
    slots = max_l + 1 if greedy else 1      # greedy scores every row; sampled only the final one
    block_v, tiles, splits = _vocab_split(V, R * slots, device)
    part_val = torch.empty((R, slots, splits), dtype=torch.float32, device=device)
    part_idx = torch.empty((R, slots, splits), dtype=torch.int32, device=device)
    block_l = next_pow2(max_l + 1)

    if not greedy:
        _accept_kernel[(R,)](target_probs, draft_ids, q, cu, u, num_accepted, V,
                             HAS_DRAFT_PROBS=has_q, BLOCK_L=block_l)
    _scores_kernel[(R, slots, splits)](target_probs, draft_ids, q, cu, noise, num_accepted, part_val, part_idx,
                                       V, slots, splits, tiles, GREEDY=greedy, HAS_DRAFT_PROBS=has_q,
                                       BLOCK_V=block_v)
    _finalize_kernel[(R,)](draft_ids, cu, part_val, part_idx, num_accepted, out, slots, splits, max_l + 1,
                           GREEDY=greedy, BLOCK_L=block_l, BLOCK_S=next_pow2(splits))
    return out, num_accepted


if HAS_TRITON:
    @triton.jit
    def _argmax_combine(vals, idxs):
        """Reduce a vector of (value, index) candidates to the max value and its smallest index."""
        best = tl.max(vals, 0)
        return best, tl.min(tl.where(vals == best, idxs, 2147483647), 0)

    @triton.jit
    def _accept_kernel(
        target_probs_ptr,   # [T, V]
        draft_ids_ptr,      # [D]
        draft_probs_ptr,    # [D, V] (unread without HAS_DRAFT_PROBS)
        cu_ptr,             # [R + 1]
        uniforms_ptr,       # [D]
        num_accepted_ptr,   # [R] out
        V,
        HAS_DRAFT_PROBS: tl.constexpr,
        BLOCK_L: tl.constexpr,
    ):
        r = tl.program_id(0)
        start = tl.load(cu_ptr + r)
        n = tl.load(cu_ptr + r + 1) - start
        offs = tl.arange(0, BLOCK_L)
        valid = offs < n
        d = start + offs
        x = tl.load(draft_ids_ptr + d, mask=valid, other=0)
        in_vocab = valid & (x >= 0) & (x < V)      # a bad id (caught in debug mode) is rejected, never read
        p_x = tl.load(target_probs_ptr + (d + r) * V + x, mask=in_vocab, other=0.0).to(tl.float32)
        if HAS_DRAFT_PROBS:
            q_x = tl.load(draft_probs_ptr + d * V + x, mask=in_vocab, other=1.0).to(tl.float32)
        else:
            q_x = 1.0
        u = tl.load(uniforms_ptr + d, mask=valid, other=1.0).to(tl.float32)
        rejected = valid & ~(u * q_x < p_x)
        tl.store(num_accepted_ptr + r, tl.min(tl.where(rejected, offs.to(tl.int64), n), 0))

    @triton.jit
    def _scores_kernel(
        target_probs_ptr,   # [T, V]
        draft_ids_ptr,      # [D]
        draft_probs_ptr,    # [D, V] (unread without HAS_DRAFT_PROBS)
        cu_ptr,             # [R + 1]
        noise_ptr,          # [R, V] (unread in greedy mode)
        num_accepted_ptr,   # [R] (sampled: the one position to score)
        part_val_ptr,       # [R, slots, S] out: best score per vocab split
        part_idx_ptr,       # [R, slots, S] out: its smallest index
        V, slots, S, tiles,
        GREEDY: tl.constexpr,
        HAS_DRAFT_PROBS: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        """Program (r, slot, s): argmax over vocab split s of the score row that decides request r's
        token at position k (greedy: k = slot, score p_k; sampled: k = num_accepted[r], score
        residual_k / noise_r if k < l_r else p_k / noise_r)."""
        r = tl.program_id(0).to(tl.int64)
        slot = tl.program_id(1)
        s = tl.program_id(2)
        start = tl.load(cu_ptr + r)
        n = tl.load(cu_ptr + r + 1) - start
        if GREEDY:
            k = slot.to(tl.int64)
        else:
            k = tl.load(num_accepted_ptr + r)
        if k <= n:
            row = start + r + k
            d = start + k
            rejected = k < n
            q_limit = tl.where(rejected, V, 0)      # read q only at a rejected position
            x = tl.load(draft_ids_ptr + d, mask=rejected, other=-1)
            run_val = tl.full([BLOCK_V], float("-inf"), tl.float32)
            run_idx = tl.zeros([BLOCK_V], tl.int32)
            for t in range(0, tiles):
                offs = (s * tiles + t) * BLOCK_V + tl.arange(0, BLOCK_V)
                in_vocab = offs < V
                score = tl.load(target_probs_ptr + row * V + offs, mask=in_vocab, other=0.0).to(tl.float32)
                if not GREEDY:
                    if HAS_DRAFT_PROBS:
                        q = tl.load(draft_probs_ptr + d * V + offs, mask=offs < q_limit, other=0.0)
                        residual = tl.maximum(score - q.to(tl.float32), 0.0)
                    else:
                        residual = tl.where(offs == x, 0.0, score)
                    noise = tl.load(noise_ptr + r * V + offs, mask=in_vocab, other=1.0).to(tl.float32)
                    score = tl.div_rn(tl.where(rejected, residual, score), noise)   # IEEE, like torch
                score = tl.where(in_vocab, score, float("-inf"))
                better = score > run_val          # strict: earlier tiles win ties
                run_val = tl.where(better, score, run_val)
                run_idx = tl.where(better, offs, run_idx)
            best, idx = _argmax_combine(run_val, run_idx)
            out = (r * slots + slot) * S + s
            tl.store(part_val_ptr + out, best)
            tl.store(part_idx_ptr + out, idx)

    @triton.jit
    def _finalize_kernel(
        draft_ids_ptr,      # [D]
        cu_ptr,             # [R + 1]
        part_val_ptr,       # [R, slots, S]
        part_idx_ptr,       # [R, slots, S]
        num_accepted_ptr,   # [R] (greedy: out; sampled: in)
        out_ptr,            # [R, out_w] out
        slots, S, out_w,
        GREEDY: tl.constexpr,
        BLOCK_L: tl.constexpr,
        BLOCK_S: tl.constexpr,
    ):
        r = tl.program_id(0)
        start = tl.load(cu_ptr + r)
        n = tl.load(cu_ptr + r + 1) - start
        offs = tl.arange(0, BLOCK_L)
        s_offs = tl.arange(0, BLOCK_S)
        x = tl.load(draft_ids_ptr + start + offs, mask=offs < n, other=-1)
        if GREEDY:
            # argmax of every verified row, then accept while the draft equals it
            mask = (offs[:, None] <= n) & (s_offs[None, :] < S)
            part = (r * slots + offs[:, None]) * S + s_offs[None, :]
            vals = tl.load(part_val_ptr + part, mask=mask, other=float("-inf"))
            idxs = tl.load(part_idx_ptr + part, mask=mask, other=2147483647)
            best = tl.max(vals, 1)
            argmax = tl.min(tl.where(vals == best[:, None], idxs, 2147483647), 1)      # [BLOCK_L]
            rejected = (offs < n) & (argmax.to(tl.int64) != x)
            num_accepted = tl.min(tl.where(rejected, offs.to(tl.int64), n), 0)
            final = tl.sum(tl.where(offs == num_accepted, argmax, 0), 0)
            tl.store(num_accepted_ptr + r, num_accepted)
        else:
            num_accepted = tl.load(num_accepted_ptr + r)
            part = r * slots * S + s_offs
            vals = tl.load(part_val_ptr + part, mask=s_offs < S, other=float("-inf"))
            idxs = tl.load(part_idx_ptr + part, mask=s_offs < S, other=2147483647)
            best, final = _argmax_combine(vals, idxs)
        tokens = tl.where(offs < num_accepted, x, tl.where(offs == num_accepted, final.to(tl.int64), -1))
        tl.store(out_ptr + r * out_w + offs, tokens, mask=offs < out_w)
