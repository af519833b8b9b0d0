"""DSpark's sequential Markov sampler (vanilla head) over one drafted block, for every request.

For k = 0..B-1 (x_{-1} = the anchor):
    e_k  = W1[x_{k-1}]                          # [R, r]  the previous token's Markov embedding
    l_k  = U_k + W2 e_k                         # [R, D]  parallel-drafter logits + Markov bias
    d_k  = argmax l_k                           # greedy (temperature == 0)
    q_k  = softmax(l_k / T); d_k = argmax q_k / E_k   # sampled, E_k ~ Exp(1) i.i.d. (exact sample)
    x_k  = draft_ids[d_k]                       # the target token (x_k = d_k without a reduced vocabulary)
    z_k  = w . [h_k ; e_k] + b                  # confidence logit (w has H or H + r entries)
A reduced draft vocabulary (speculators' `draft_vocab_size` D < V) works in draft space throughout: U_k, W2, q_k and
the noise have D columns, `draft_ids` [D] maps a draft id to its target id, and W1 stays indexed by target ids
(the anchor and earlier drafts are target tokens). Without `draft_ids`, D = V.
W2 e_k is computed like ``nn.Linear`` in W2's dtype (fp32 accumulation, rounded to that dtype), then
added to the fp32 logits. Without W1/W2 (markov_rank = 0) this is plain DFlash sampling and the
confidence head sees h_k only. Every step needs the previous token, so the loop over k is sequential;
each step is one [R, r] x [r, V] product plus a vocab-wide argmax (and softmax when sampling).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .argmax import first_argmax
from .dispatch import (HAS_TRITON, check, check_token_range, debug_enabled, next_pow2, select_backend, tl,
                       triton)


def markov_sample_block(
    base_logits: torch.Tensor,                # [R, B, D] drafter logits U_k over the draft vocabulary
    hidden: torch.Tensor | None,              # [R, B, H] drafter hidden states h_k (for confidence)
    anchor_ids: torch.Tensor,                 # [R] int64 last committed (target) token per request
    w1: torch.Tensor | None,                  # [V, r] Markov embedding (by target id; any float dtype: read as w2's), or None
    w2: torch.Tensor | None,                  # [D, r] Markov output projection, or None
    conf_weight: torch.Tensor | None,         # [H + r] or [H] (any shape with that many entries), or None
    conf_bias: torch.Tensor | float | None,   # 0-d / [1]
    temperature: float,                       # 0 -> greedy
    exp_noise: torch.Tensor | None,           # [R, B, D] i.i.d. Exp(1); None when greedy
    *,
    draft_ids: torch.Tensor | None = None,    # [D] int64 target id of each draft id; None: D = V, identity
    backend: str | None = None,
    debug: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Returns (tokens [R, B] int64 target ids, q [R, B, D] float32 over the draft vocabulary or None when greedy,
    conf_logits [R, B] float32 or None without a confidence head)."""
    temperature = float(temperature)
    greedy = temperature == 0.0
    _check_shapes(base_logits, hidden, anchor_ids, w1, w2, conf_weight, temperature, exp_noise, draft_ids)
    R, B, V = base_logits.shape  # V: the columns sampled over (the draft vocabulary D when reduced)
    if debug_enabled(debug):
        check_token_range(anchor_ids, w1.shape[0] if w1 is not None else V, "anchor_ids")
        if draft_ids is not None and w1 is not None:
            check_token_range(draft_ids, w1.shape[0], "draft_ids")
        if not greedy and exp_noise.numel():
            check(bool((exp_noise > 0).all()),
                  "exp_noise must be positive Exp(1) samples; draw them with hf_dspark.kernels.exp_noise(...).")
    device = base_logits.device
    if R == 0 or B == 0:
        return (torch.empty((R, B), dtype=torch.long, device=device),
                None if greedy else torch.empty((R, B, V), dtype=torch.float32, device=device),
                None if conf_weight is None else torch.empty((R, B), dtype=torch.float32, device=device))
    if conf_weight is not None:
        conf_weight = conf_weight.reshape(-1)
        conf_bias = torch.as_tensor(0.0 if conf_bias is None else conf_bias, device=device).reshape(())
    if w1 is None:
        # no Markov dependence: the B positions are independent, so treat them as R * B one-step rows
        base_logits = base_logits.reshape(R * B, 1, V)
        hidden = None if hidden is None else hidden.reshape(R * B, 1, -1)
        exp_noise = None if exp_noise is None else exp_noise.reshape(R * B, 1, V)
        anchor_ids = torch.zeros(R * B, dtype=torch.long, device=device)
    args = (base_logits, hidden, anchor_ids, w1, w2, conf_weight, conf_bias, temperature, exp_noise, draft_ids)
    use_triton = select_backend(backend, base_logits, hidden, anchor_ids, w1, w2, conf_weight,
                                exp_noise, draft_ids) == "triton"
    tokens, q, conf = _markov_sample_triton(*args) if use_triton else _markov_sample_torch(*args)
    return (tokens.reshape(R, B), None if q is None else q.reshape(R, B, V),
            None if conf is None else conf.reshape(R, B))


def _check_shapes(base_logits, hidden, anchor_ids, w1, w2, conf_weight, temperature, exp_noise, draft_ids):
    check(base_logits.dim() == 3, "base_logits must be [R, B, V]; add a batch dimension for one request.")
    R, B, V = base_logits.shape
    check(anchor_ids.numel() == R, f"anchor_ids holds {anchor_ids.numel()} ids for {R} requests; pass one per request.")
    check((w1 is None) == (w2 is None), "pass both Markov weights w1 and w2, or neither (markov_rank = 0).")
    if draft_ids is not None:
        check(draft_ids.dim() == 1 and draft_ids.numel() == V and not draft_ids.is_floating_point(),
              f"draft_ids must be an integer [D] tensor with D = {V} (the columns of base_logits); "
              f"got {draft_ids.dtype} {tuple(draft_ids.shape)}.")
    if w1 is not None:
        rows = w1.shape[0] if draft_ids is not None else V
        check(w1.dim() == 2 and w1.shape[0] == rows and w2.dim() == 2 and tuple(w2.shape) == (V, w1.shape[1]),
              f"w1 must be [V, r] and w2 [D, r] with D = {V}" + ("" if draft_ids is not None else " = V")
              + f"; got {tuple(w1.shape)} and {tuple(w2.shape)}.")
    check(temperature >= 0, f"temperature must be >= 0 (0 = greedy), got {temperature}.")
    if temperature > 0:
        check(exp_noise is not None and tuple(exp_noise.shape) == (R, B, V),
              f"sampling needs exp_noise of shape [R, B, V] = [{R}, {B}, {V}]; pass Exp(1) noise or use temperature 0.")
    if conf_weight is not None:
        check(hidden is not None and hidden.dim() == 3 and tuple(hidden.shape[:2]) == (R, B),
              "the confidence head needs hidden [R, B, H]; pass the drafter's hidden states or conf_weight=None.")
        H = hidden.shape[2]
        rank = 0 if w1 is None else w1.shape[1]
        n = conf_weight.numel()
        check(n == H or (rank and n == H + rank),
              f"conf_weight has {n} entries but must have H = {H}" + (f" or H + r = {H + rank}" if rank else "")
              + "; pass the confidence head's weight for this drafter.")


# --------------------------------------------------------------------------------------------
# torch reference
# --------------------------------------------------------------------------------------------

def _markov_sample_torch(base_logits, hidden, anchor_ids, w1, w2, conf_weight, conf_bias, temperature, exp_noise,
                         draft_ids):
    R, B, V = base_logits.shape
    device = base_logits.device
    greedy = temperature == 0.0
    tokens = torch.empty((R, B), dtype=torch.long, device=device)
    q = None if greedy else torch.empty((R, B, V), dtype=torch.float32, device=device)
    conf = markov_conf = None
    if conf_weight is not None:
        H = hidden.shape[-1]
        cw = conf_weight.float()
        conf = hidden.float() @ cw[:H] + conf_bias.float()                        # [R, B]
        markov_conf = cw[H:] if cw.numel() > H else None
    prev = anchor_ids.long()
    for k in range(B):
        logits = base_logits[:, k].float()                                        # [R, V]
        if w1 is not None:
            e = w1[prev].to(w2.dtype)                                             # [R, r]
            logits = logits + F.linear(e, w2).float()
            if markov_conf is not None:
                conf[:, k] += e.float() @ markov_conf
        if greedy:
            prev = first_argmax(logits)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            prev = first_argmax(probs / exp_noise[:, k].float())
            q[:, k] = probs
        if draft_ids is not None:
            prev = draft_ids[prev].long()                                         # draft id -> target id
        tokens[:, k] = prev
    return tokens, q, conf


# --------------------------------------------------------------------------------------------
# Triton kernels: per step one launch over vocab tiles (logits, tile argmax, tile softmax stats)
# and one per request block (reduce the tiles -> token, log-sum-exp, confidence); a last launch
# turns the stored logits / T into probabilities.
# --------------------------------------------------------------------------------------------

def _markov_sample_triton(base_logits, hidden, anchor_ids, w1, w2, conf_weight, conf_bias, temperature,
                          exp_noise, draft_ids):
    R, B, V = base_logits.shape
    device = base_logits.device
    on_gpu = device.type == "cuda"
    greedy = temperature == 0.0
    has_markov = w1 is not None
    has_conf = conf_weight is not None
    placeholder = torch.zeros(1, dtype=torch.float32, device=device)
    base_logits = base_logits.contiguous()
    anchors = anchor_ids.long().contiguous()
    if has_markov:
        w2 = w2.contiguous()
        w1 = w1.to(w2.dtype).contiguous()
        w1_rows, rank = w1.shape
    else:
        w1 = w2 = placeholder
        rank, w1_rows = 0, V
    has_map = draft_ids is not None
    id_map = draft_ids.long().contiguous() if has_map else placeholder.long()
    noise = placeholder if greedy else exp_noise.contiguous()
    if has_conf:
        hidden = hidden.contiguous()
        H = hidden.shape[2]
        cw = conf_weight.float().contiguous()
        markov_conf = cw.numel() > H
        bias = conf_bias.float().reshape(1).contiguous()
    else:
        hidden = cw = bias = placeholder
        H, markov_conf = 0, False

    tokens = torch.empty((R, B), dtype=torch.long, device=device)
    q = placeholder if greedy else torch.empty((R, B, V), dtype=torch.float32, device=device)
    lse = torch.empty((R, B), dtype=torch.float32, device=device)
    conf = torch.empty((R, B), dtype=torch.float32, device=device) if has_conf else placeholder

    block_r = min(64, max(16, next_pow2(R)))
    block_v = 128 if on_gpu else 64
    n_vt = triton.cdiv(V, block_v)
    part_val = torch.empty((R, n_vt), dtype=torch.float32, device=device)
    part_idx = torch.empty((R, n_vt), dtype=torch.int32, device=device)
    part_max = placeholder if greedy else torch.empty((R, n_vt), dtype=torch.float32, device=device)
    part_sum = placeholder if greedy else torch.empty((R, n_vt), dtype=torch.float32, device=device)
    pick_rows = 4 if on_gpu else 16
    native_dot = on_gpu and w2.dtype in (torch.float16, torch.bfloat16)

    for k in range(B):
        prev, prev_stride = (anchors, 1) if k == 0 else (tokens[:, k - 1], B)
        _markov_logits_kernel[(n_vt, triton.cdiv(R, block_r))](
            base_logits, prev, w1, w2, noise, q, part_val, part_idx, part_max, part_sum,
            R, B, V, w1_rows, rank, k, prev_stride, n_vt, temperature if not greedy else 1.0,
            HAS_MARKOV=has_markov, GREEDY=greedy, NATIVE_DOT=native_dot,
            BLOCK_R=block_r, BLOCK_V=block_v, BLOCK_K=min(64, max(16, next_pow2(rank))))
        _markov_pick_kernel[(triton.cdiv(R, pick_rows),)](
            part_val, part_idx, part_max, part_sum, prev, w1, hidden, cw, bias, id_map, tokens, lse, conf,
            R, B, w1_rows, k, n_vt, prev_stride, rank, H,
            GREEDY=greedy, HAS_CONF=has_conf, MARKOV_CONF=markov_conf and has_markov, HAS_MAP=has_map,
            ROWS=pick_rows, BLOCK_T=min(512, next_pow2(n_vt)), BLOCK_H=256,
            BLOCK_K=max(16, next_pow2(rank)))
    if not greedy:
        norm_rows = 1 if on_gpu else 16
        norm_v = 1024 if on_gpu else 128
        _normalize_kernel[(triton.cdiv(R * B, norm_rows), triton.cdiv(V, norm_v))](
            q, lse, R * B, V, ROWS=norm_rows, BLOCK_V=norm_v)
    return tokens, None if greedy else q, conf if has_conf else None


if HAS_TRITON:

    @triton.jit
    def _markov_logits_kernel(
        base_ptr,       # [R, B, V] drafter logits
        prev_ptr,       # [R] previous (target) tokens (stride prev_stride)
        w1_ptr,         # [VW, rank] (VW: target vocabulary)
        w2_ptr,         # [V, rank] (V: the sampled columns, the draft vocabulary)
        noise_ptr,      # [R, B, V] (sampled)
        z_ptr,          # [R, B, V] out (sampled): logits / T, normalised later
        part_val_ptr,   # [R, n_vt] out: best score in the tile
        part_idx_ptr,   # [R, n_vt] out: its smallest index
        part_max_ptr,   # [R, n_vt] out (sampled): max of logits / T in the tile
        part_sum_ptr,   # [R, n_vt] out (sampled): sum exp(logits / T - tile max)
        R, B, V, VW, rank, k, prev_stride, n_vt, temperature,
        HAS_MARKOV: tl.constexpr,
        GREEDY: tl.constexpr,
        NATIVE_DOT: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_V: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        vt = tl.program_id(0)
        rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = vt * BLOCK_V + tl.arange(0, BLOCK_V)
        row_ok = rows < R
        col_ok = cols < V
        mask = row_ok[:, None] & col_ok[None, :]
        offs = (rows.to(tl.int64) * B + k)[:, None] * V + cols[None, :]
        logits = tl.load(base_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_MARKOV:
            prev = tl.load(prev_ptr + rows * prev_stride, mask=row_ok, other=0)
            prev_ok = row_ok & (prev >= 0) & (prev < VW)     # a bad anchor (caught in debug mode) reads nothing
            acc = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.float32)
            for k0 in range(0, rank, BLOCK_K):
                ks = k0 + tl.arange(0, BLOCK_K)
                k_ok = ks < rank
                e = tl.load(w1_ptr + prev[:, None] * rank + ks[None, :], mask=prev_ok[:, None] & k_ok[None, :],
                            other=0.0)
                w = tl.load(w2_ptr + cols[:, None].to(tl.int64) * rank + ks[None, :],
                            mask=col_ok[:, None] & k_ok[None, :], other=0.0)
                if NATIVE_DOT:   # half inputs: exact products, fp32 accumulation
                    acc = tl.dot(e, tl.trans(w), acc)
                else:
                    acc = tl.dot(e.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
            logits += acc.to(w2_ptr.dtype.element_ty).to(tl.float32)     # nn.Linear rounding
        if GREEDY:
            score = logits
        else:
            z = tl.div_rn(logits, temperature)     # IEEE division, like torch (plain / is approximate)
            tl.store(z_ptr + offs, z, mask=mask)
            z = tl.where(mask, z, float("-inf"))
            tile_max = tl.max(z, 1)
            safe_max = tl.where(tile_max > float("-inf"), tile_max, 0.0)   # padded rows, all -inf tiles
            tile_sum = tl.sum(tl.exp(z - safe_max[:, None]), 1)
            noise = tl.load(noise_ptr + offs, mask=mask, other=1.0).to(tl.float32)
            score = z - tl.log(noise)         # argmax q / E == argmax (logits / T - log E)
            tl.store(part_max_ptr + rows * n_vt + vt, tile_max, mask=row_ok)
            tl.store(part_sum_ptr + rows * n_vt + vt, tile_sum, mask=row_ok)
        score = tl.where(mask, score, float("-inf"))
        best = tl.max(score, 1)
        idx = tl.min(tl.where(score == best[:, None], cols[None, :], 2147483647), 1)
        tl.store(part_val_ptr + rows * n_vt + vt, best, mask=row_ok)
        tl.store(part_idx_ptr + rows * n_vt + vt, idx, mask=row_ok)

    @triton.jit
    def _markov_pick_kernel(
        part_val_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr,   # [R, n_vt]
        prev_ptr,       # [R] previous (target) tokens (stride prev_stride)
        w1_ptr,         # [VW, rank]
        hidden_ptr,     # [R, B, H]
        cw_ptr,         # [H (+ rank)] confidence weight, fp32
        bias_ptr,       # [1] confidence bias, fp32
        map_ptr,        # [V] target id of each draft id (read with HAS_MAP)
        tokens_ptr,     # [R, B] out: target ids
        lse_ptr,        # [R, B] out (sampled): log-sum-exp of logits / T
        conf_ptr,       # [R, B] out: confidence logits
        R, B, VW, k, n_vt, prev_stride, rank, H,
        GREEDY: tl.constexpr,
        HAS_CONF: tl.constexpr,
        MARKOV_CONF: tl.constexpr,
        HAS_MAP: tl.constexpr,
        ROWS: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        row_ok = rows < R
        run_val = tl.full([ROWS, BLOCK_T], float("-inf"), tl.float32)
        run_idx = tl.zeros([ROWS, BLOCK_T], tl.int32)
        run_max = tl.full([ROWS, BLOCK_T], float("-inf"), tl.float32)
        for t0 in range(0, n_vt, BLOCK_T):
            ts = t0 + tl.arange(0, BLOCK_T)
            mask = row_ok[:, None] & (ts < n_vt)[None, :]
            part = rows[:, None] * n_vt + ts[None, :]
            vals = tl.load(part_val_ptr + part, mask=mask, other=float("-inf"))
            idxs = tl.load(part_idx_ptr + part, mask=mask, other=2147483647)
            better = vals > run_val           # strict: earlier tiles win ties
            run_val = tl.where(better, vals, run_val)
            run_idx = tl.where(better, idxs, run_idx)
            if not GREEDY:
                run_max = tl.maximum(run_max, tl.load(part_max_ptr + part, mask=mask, other=float("-inf")))
        best = tl.max(run_val, 1)
        token = tl.min(tl.where(run_val == best[:, None], run_idx, 2147483647), 1).to(tl.int64)
        if HAS_MAP:     # draft id -> target id
            token = tl.load(map_ptr + token, mask=row_ok, other=0)
        out = rows * B + k
        tl.store(tokens_ptr + out, token, mask=row_ok)
        if not GREEDY:
            m = tl.max(run_max, 1)
            m = tl.where(row_ok, m, 0.0)
            total = tl.zeros([ROWS], tl.float32)
            for t0 in range(0, n_vt, BLOCK_T):
                ts = t0 + tl.arange(0, BLOCK_T)
                mask = row_ok[:, None] & (ts < n_vt)[None, :]
                part = rows[:, None] * n_vt + ts[None, :]
                pm = tl.load(part_max_ptr + part, mask=mask, other=0.0)
                ps = tl.load(part_sum_ptr + part, mask=mask, other=0.0)
                total += tl.sum(ps * tl.exp(pm - m[:, None]), 1)
            tl.store(lse_ptr + out, m + tl.log(tl.where(row_ok, total, 1.0)), mask=row_ok)
        if HAS_CONF:
            acc = tl.zeros([ROWS], tl.float32)
            for h0 in range(0, H, BLOCK_H):
                hs = h0 + tl.arange(0, BLOCK_H)
                h_ok = hs < H
                h = tl.load(hidden_ptr + (rows.to(tl.int64) * B + k)[:, None] * H + hs[None, :],
                            mask=row_ok[:, None] & h_ok[None, :], other=0.0).to(tl.float32)
                acc += tl.sum(h * tl.load(cw_ptr + hs, mask=h_ok, other=0.0)[None, :], 1)
            if MARKOV_CONF:
                prev = tl.load(prev_ptr + rows * prev_stride, mask=row_ok, other=0)
                prev_ok = row_ok & (prev >= 0) & (prev < VW)
                ks = tl.arange(0, BLOCK_K)
                k_ok = ks < rank
                e = tl.load(w1_ptr + prev[:, None] * rank + ks[None, :], mask=prev_ok[:, None] & k_ok[None, :],
                            other=0.0).to(tl.float32)
                acc += tl.sum(e * tl.load(cw_ptr + H + ks, mask=k_ok, other=0.0)[None, :], 1)
            tl.store(conf_ptr + out, acc + tl.load(bias_ptr), mask=row_ok)

    @triton.jit
    def _normalize_kernel(
        z_ptr,          # [N, V] logits / T, overwritten with softmax probabilities
        lse_ptr,        # [N] log-sum-exp per row
        N, V,
        ROWS: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
        mask = (rows < N)[:, None] & (cols < V)[None, :]
        offs = rows.to(tl.int64)[:, None] * V + cols[None, :]
        lse = tl.load(lse_ptr + rows, mask=rows < N, other=0.0)
        z = tl.load(z_ptr + offs, mask=mask, other=0.0)
        tl.store(z_ptr + offs, tl.exp(z - lse[:, None]), mask=mask)
