"""Moving between the padded per-request layout (what a padded transformers cache sees) and the
flat ragged layout (what the rejection sampler works on), and compacting KV caches.

Request r verifies l_r = num_verify[r] drafts: its verify row is [anchor, draft_0..draft_{l_r-1}]
at positions start_pos[r] + 0..l_r, padded to L + 1 = max l_r + 1 columns. Flattening keeps the
first l_r + 1 rows of each request, in request order (T = sum l_r + R rows).
"""

from __future__ import annotations

import torch

from .dispatch import HAS_TRITON, check, debug_enabled, next_pow2, select_backend, tl, triton


def build_cu_num_draft(num_verify: torch.Tensor) -> torch.Tensor:
    """[R] draft counts -> [R + 1] int64 cumulative counts starting at 0 (the ragged offsets)."""
    cu = torch.zeros(num_verify.numel() + 1, dtype=torch.long, device=num_verify.device)
    torch.cumsum(num_verify.reshape(-1), 0, out=cu[1:])
    return cu


def build_verify_inputs(
    anchor_ids: torch.Tensor,     # [R] int64 last committed token
    draft_ids: torch.Tensor,      # [R, B] int64 drafted tokens
    num_verify: torch.Tensor,     # [R] int64 drafts to verify per request, 0..B
    start_pos: torch.Tensor,      # [R] int64 position of the anchor
    pad_id: int,
    *,
    backend: str | None = None,
    debug: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (input_ids [R, L+1] int64, position_ids [R, L+1] int64, valid [R, L+1] bool) with
    L = max num_verify: row r = [anchor, draft_0..draft_{l_r-1}, pad...] at start_pos[r] + j."""
    check(draft_ids.dim() == 2, "draft_ids must be [R, B]; add a batch dimension for one request.")
    R, B = draft_ids.shape
    check(anchor_ids.numel() == R and num_verify.numel() == R and start_pos.numel() == R,
          f"anchor_ids, num_verify and start_pos must each hold R = {R} entries (one per draft_ids row).")
    device = draft_ids.device
    L = int(num_verify.max()) if R else 0
    if R and (L > B or (debug_enabled(debug) and int(num_verify.min()) < 0)):
        raise ValueError(f"num_verify must lie in [0, {B}] (the drafted block length); "
                         f"clamp it before building inputs.")
    if R == 0:
        empty = torch.empty((0, L + 1), dtype=torch.long, device=device)
        return empty, empty.clone(), empty.bool()
    args = (anchor_ids, draft_ids, num_verify, start_pos, pad_id, L)
    if select_backend(backend, anchor_ids, draft_ids, num_verify, start_pos) == "triton":
        return _build_verify_inputs_triton(*args)
    return _build_verify_inputs_torch(*args)


def gather_kv(
    kv: torch.Tensor,             # [R, Hk, S, D]
    keep_index: torch.Tensor,     # [R, S_new] int64 positions to keep, in their new order
    *,
    backend: str | None = None,
    debug: bool | None = None,
) -> torch.Tensor:
    """Gather along the sequence dim: out[r, h, i] = kv[r, h, keep_index[r, i]] -> [R, Hk, S_new, D]."""
    check(kv.dim() == 4 and keep_index.dim() == 2 and keep_index.shape[0] == kv.shape[0],
          f"gather_kv needs kv [R, Hk, S, D] and keep_index [R, S_new]; got {tuple(kv.shape)} and "
          f"{tuple(keep_index.shape)}.")
    if debug_enabled(debug) and keep_index.numel():
        S = kv.shape[2]
        check(int(keep_index.min()) >= 0 and int(keep_index.max()) < S,
              f"keep_index must hold cache positions in [0, {S}); build it from this cache's valid mask.")
    R, Hk, _, D = kv.shape
    if keep_index.numel() == 0 or kv.numel() == 0:
        return kv.new_empty((R, Hk, keep_index.shape[1], D))
    if select_backend(backend, kv, keep_index) == "triton":
        return _gather_kv_triton(kv, keep_index)
    if R == 1:  # one request: index_select, ~3x faster on CPU than an expanded gather (compaction does 60 of these)
        return kv.index_select(2, keep_index[0])
    return kv.gather(2, keep_index[:, None, :, None].expand(R, Hk, keep_index.shape[1], D))


def flatten_ragged(
    target_rows: torch.Tensor,    # [R, L+1, V] per-request verify rows (padded)
    num_verify: torch.Tensor,     # [R] int64 drafts verified per request
    *,
    backend: str | None = None,
    debug: bool | None = None,
) -> torch.Tensor:
    """Keep the first l_r + 1 rows of each request -> [T, V], T = sum l_r + R, request order. With one position per
    request (L = 0: a plain decoding step) that is the position itself, returned as a view of target_rows: the
    boolean gather it replaces copied the whole [R, V] (about 0.1 ms of a batch-1 step on CPU). So is a batch in
    which every request keeps all its rows (0.8 ms alone, ~3 ms in the loop's profile, for [8, 8, 49152] fp32 rows)."""
    check(target_rows.dim() == 3 and num_verify.numel() == target_rows.shape[0],
          f"flatten_ragged needs target_rows [R, L+1, V] and num_verify [R]; got {tuple(target_rows.shape)} "
          f"and {num_verify.numel()} counts.")
    R, W, V = target_rows.shape
    if debug_enabled(debug) and R:
        check(int(num_verify.min()) >= 0 and int(num_verify.max()) < W,
              f"num_verify must lie in [0, {W - 1}] for target_rows with {W} positions per request.")
    if R == 0:
        return target_rows.new_empty((0, V))
    if W == 1:
        return target_rows[:, 0]
    if num_verify.device.type == "cpu" and bool((num_verify == W - 1).all()):  # all rows kept (a full chain): a view
        return target_rows.reshape(R * W, V)
    if select_backend(backend, target_rows, num_verify) == "triton":
        return _flatten_ragged_triton(target_rows, num_verify)
    keep = torch.arange(W, device=target_rows.device)[None, :] <= num_verify.to(target_rows.device)[:, None]  # [R, W]
    return target_rows.reshape(R * W, V).index_select(0, keep.reshape(-1).nonzero().squeeze(1))  # ~0.6x a bool gather


# --------------------------------------------------------------------------------------------
# torch references (build_verify_inputs; gather_kv and flatten_ragged are inline above)
# --------------------------------------------------------------------------------------------

def _build_verify_inputs_torch(anchor_ids, draft_ids, num_verify, start_pos, pad_id, L):
    R = draft_ids.shape[0]
    device = draft_ids.device
    j = torch.arange(L + 1, device=device)
    valid = j[None, :] <= num_verify.to(device)[:, None]                        # [R, L+1]
    ids = torch.cat([anchor_ids.reshape(R, 1).long(), draft_ids[:, :L].long()], dim=1)
    input_ids = torch.where(valid, ids, torch.full_like(ids, pad_id))
    position_ids = start_pos.reshape(R, 1).long() + j[None, :]
    return input_ids, position_ids, valid


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------

def _build_verify_inputs_triton(anchor_ids, draft_ids, num_verify, start_pos, pad_id, L):
    R, B = draft_ids.shape
    device = draft_ids.device
    input_ids = torch.empty((R, L + 1), dtype=torch.long, device=device)
    position_ids = torch.empty((R, L + 1), dtype=torch.long, device=device)
    valid = torch.empty((R, L + 1), dtype=torch.bool, device=device)
    rows = 16
    _verify_inputs_kernel[(triton.cdiv(R, rows),)](
        anchor_ids.contiguous(), draft_ids.contiguous(), num_verify.contiguous(), start_pos.contiguous(),
        input_ids, position_ids, valid, R, B, L + 1, pad_id, ROWS=rows, BLOCK_L=next_pow2(L + 1))
    return input_ids, position_ids, valid


def _gather_kv_triton(kv, keep_index):
    R, Hk, S, D = kv.shape
    if kv.stride(3) != 1:
        kv = kv.contiguous()
    S_new = keep_index.shape[1]
    out = kv.new_empty((R, Hk, S_new, D))
    block_s = 64 if kv.is_cuda else 16
    _gather_kv_kernel[(R * Hk, triton.cdiv(S_new, block_s))](
        kv, keep_index.contiguous(), out, Hk, S, S_new, D, kv.stride(0), kv.stride(1), kv.stride(2),
        BLOCK_S=block_s, BLOCK_D=next_pow2(D))
    return out


def _flatten_ragged_triton(target_rows, num_verify):
    R, W, V = target_rows.shape
    if target_rows.stride(2) != 1:
        target_rows = target_rows.contiguous()
    num_verify = num_verify.to(device=target_rows.device, dtype=torch.long)
    cu = build_cu_num_draft(num_verify)
    T = int(cu[-1]) + R
    out = target_rows.new_empty((T, V))
    block_v = 1024 if target_rows.is_cuda else 128
    chunk = 8 * block_v if target_rows.is_cuda else triton.cdiv(V, block_v) * block_v
    _flatten_ragged_kernel[(R, W, triton.cdiv(V, chunk))](
        target_rows, cu, out, V, target_rows.stride(0), target_rows.stride(1), chunk // block_v,
        BLOCK_V=block_v)
    return out


if HAS_TRITON:

    @triton.jit
    def _verify_inputs_kernel(
        anchor_ptr,     # [R]
        draft_ptr,      # [R, B]
        num_ptr,        # [R]
        start_ptr,      # [R]
        ids_ptr,        # [R, W] out
        pos_ptr,        # [R, W] out
        valid_ptr,      # [R, W] out (bool)
        R, B, W, pad_id,
        ROWS: tl.constexpr,
        BLOCK_L: tl.constexpr,
    ):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        j = tl.arange(0, BLOCK_L)
        row_ok = rows < R
        n = tl.load(num_ptr + rows, mask=row_ok, other=0)
        anchor = tl.load(anchor_ptr + rows, mask=row_ok, other=0)
        start = tl.load(start_ptr + rows, mask=row_ok, other=0)
        valid = j[None, :] <= n[:, None]
        is_draft = valid & (j[None, :] > 0) & row_ok[:, None]
        drafts = tl.load(draft_ptr + rows[:, None] * B + j[None, :] - 1, mask=is_draft, other=0)
        ids = tl.where(j[None, :] == 0, anchor[:, None], drafts)
        ids = tl.where(valid, ids, pad_id)
        out = rows[:, None] * W + j[None, :]
        mask = row_ok[:, None] & (j[None, :] < W)
        tl.store(ids_ptr + out, ids.to(tl.int64), mask=mask)
        tl.store(pos_ptr + out, (start[:, None] + j[None, :]).to(tl.int64), mask=mask)
        tl.store(valid_ptr + out, valid, mask=mask)

    @triton.jit
    def _gather_kv_kernel(
        kv_ptr,         # [R, Hk, S, D] (last dim contiguous)
        keep_ptr,       # [R, S_new]
        out_ptr,        # [R, Hk, S_new, D] out
        Hk, S, S_new, D, stride_r, stride_h, stride_s,
        BLOCK_S: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        rh = tl.program_id(0)
        r = rh // Hk
        h = rh % Hk
        i = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
        d = tl.arange(0, BLOCK_D)
        i_ok = i < S_new
        src = tl.load(keep_ptr + r * S_new + i, mask=i_ok, other=0)
        mask = i_ok[:, None] & (d < D)[None, :]
        src_ok = (src >= 0) & (src < S)          # a bad index (caught in debug mode) reads nothing
        base = r.to(tl.int64) * stride_r + h.to(tl.int64) * stride_h
        vals = tl.load(kv_ptr + base + src[:, None] * stride_s + d[None, :], mask=mask & src_ok[:, None])
        tl.store(out_ptr + (rh.to(tl.int64) * S_new + i[:, None]) * D + d[None, :], vals, mask=mask)

    @triton.jit
    def _flatten_ragged_kernel(
        rows_ptr,       # [R, W, V] (last dim contiguous)
        cu_ptr,         # [R + 1] cumulative verify counts
        out_ptr,        # [T, V] out
        V, stride_r, stride_j, tiles,
        BLOCK_V: tl.constexpr,
    ):
        r = tl.program_id(0)
        j = tl.program_id(1)
        start = tl.load(cu_ptr + r)
        if j <= tl.load(cu_ptr + r + 1) - start:
            src = rows_ptr + r.to(tl.int64) * stride_r + j.to(tl.int64) * stride_j
            dst = out_ptr + (start + r + j) * V
            for t in range(0, tiles):
                cols = (tl.program_id(2) * tiles + t) * BLOCK_V + tl.arange(0, BLOCK_V)
                tl.store(dst + cols, tl.load(src + cols, mask=cols < V), mask=cols < V)
