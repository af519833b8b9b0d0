"""The drafter's context during generation: K/V of every token in the target's cache, projected from the target's
tapped hidden states only when the drafter next runs.

The drafter attends to every cached token, so a step that skips it (a plain step chosen by the scheduler) still
has to record its tokens. Projecting them at once (fc + norm + K/V of each drafter layer) cost about 2-3% of a
batch-32 plain step on CPU (`scripts/decode_overhead.py`), paid on every skipped step. Deferred, the taps of
skipped steps are projected in one batched call at the next drafted step (one larger matrix product: about 3x
cheaper per token on this CPU), or never when the requests finish first.

The tapped layers' outputs wait as they came out of the target's forward, one tensor per layer, and are
concatenated only when projected: concatenating them at every forward copied [R, T, m*H] values that a skipping
scheduler never projects (66 MB per batch-64 prefill of ~180 tokens in bf16, SmolLM2's 5 taps).

Columns match the target cache's columns one to one: `[projected | pending chunks in order]`. Pending taps take
m*H values per token (m tapped layers; about a quarter of SmolLM2's own KV cache per token), so at most
`max_pending` columns wait: past that they are projected at once, which bounds the memory when the drafter is
skipped for long stretches (or never runs: `num_speculative_tokens=0`). The bound is 1024 columns: at 256, a
batch-64 call whose prompt and output crossed 256 columns projected them although the scheduler never drafted
again (0.11 s, ~2.7% of the call's decoding, bf16 on a 2-core CPU).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .kernels import gather_kv
from .modeling import DSparkDrafter, KVCache


class DraftContext:
    """Per-request drafter context that the generation loop keeps aligned with the target's KV cache.

    Args:
        drafter: the drafter whose `context_features` / `context_kv` project the taps.
        max_pending: project as soon as more columns than this are waiting.
    """

    def __init__(self, drafter: DSparkDrafter, max_pending: int = 1024):
        if max_pending < 0:
            raise ValueError(f"max_pending must be >= 0, got {max_pending}.")
        self.drafter = drafter
        self.max_pending = max_pending
        self._kv: KVCache | None = None  # per drafter layer (keys, values) [R, Hk, P, D]: projected columns
        self._pending: list[tuple[tuple[torch.Tensor, ...], torch.Tensor]] = []  # (taps: parts [R, T, H_i], positions [R, T])
        self.num_pending = 0  # columns recorded but not projected yet (the widths of _pending)

    def append(self, taps: torch.Tensor | Sequence[torch.Tensor], positions: torch.Tensor) -> None:
        """Record new cache columns at positions [R, T]: taps [R, T, m*H] (the target's tapped layers, concatenated)
        or the m tapped layers' outputs [R, T, H] in order (concatenated when projected)."""
        parts = (taps,) if isinstance(taps, torch.Tensor) else tuple(taps)
        self._pending.append((parts, positions))
        self.num_pending += positions.shape[1]
        if self.num_pending > self.max_pending:
            self.kv()

    def kv(self) -> KVCache:
        """Per drafter layer (keys, values) [R, Hk, C, D] over all C columns, projecting what is pending."""
        if self._pending:
            parts, positions = self._merged_pending()
            taps = torch.cat(parts, -1) if len(parts) > 1 else parts[0]  # [R, P, m*H]
            new = self.drafter.context_kv(self.drafter.context_features(taps), positions)
            self._kv = new if self._kv is None else [
                (torch.cat([k, nk], 2), torch.cat([v, nv], 2)) for (k, v), (nk, nv) in zip(self._kv, new)
            ]
            self._pending, self.num_pending = [], 0
        if self._kv is None:
            raise RuntimeError("The drafter context is empty: append the prompt's taps before drafting.")
        return self._kv

    def select(self, idx: torch.Tensor) -> None:
        """Keep the requests `idx` [R'] (finished requests leave the batch)."""
        if self._kv is not None:
            self._kv = [(k[idx], v[idx]) for k, v in self._kv]
        if self._pending:
            parts, positions = self._merged_pending()
            self._pending = [(tuple(p[idx] for p in parts), positions[idx])]

    def crop(self, tail: int) -> None:
        """Drop the last `tail` columns (trailing cache columns that no request uses)."""
        while tail > 0 and self._pending:
            parts, positions = self._pending[-1]
            cut = min(tail, positions.shape[1])
            if cut == positions.shape[1]:
                self._pending.pop()
            else:
                self._pending[-1] = (tuple(p[:, :-cut] for p in parts), positions[:, :-cut])
            tail -= cut
            self.num_pending -= cut
        if tail > 0 and self._kv is not None:
            self._kv = [(k[:, :, :-tail], v[:, :, :-tail]) for k, v in self._kv]

    def reorder_tail(self, order: torch.Tensor, width: int) -> None:
        """Of the last `width` columns of each request, put columns order [R, m] (indices into those W, m <= W) first,
        with their positions: a draft tree's accepted path. The other W - m columns are left stale (they become holes)."""
        if self._pending and self._pending[-1][1].shape[1] >= width:  # the usual case: the verify forward's taps wait
            parts, positions = self._pending[-1]
            head = positions.shape[1] - width
            keep = torch.arange(positions.shape[1], device=order.device).repeat(order.shape[0], 1)  # [R, head + W]
            keep[:, head : head + order.shape[1]] = head + order
            self._pending[-1] = (
                tuple(p.gather(1, keep[:, :, None].expand(-1, -1, p.shape[-1])) for p in parts),
                positions.gather(1, keep),
            )
            return
        reorder_last([t for kv in self.kv() for t in kv], order, width)

    def gather(self, keep: torch.Tensor) -> None:
        """Reorder columns per request, keep [R, C'] column indices (cache compaction; projects what is pending,
        since rows keep different numbers of projected and pending columns)."""
        self._kv = [(gather_kv(k, keep), gather_kv(v, keep)) for k, v in self.kv()]

    def _merged_pending(self) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """The pending chunks as one: (parts [R, P, H_i], positions [R, P]), P = num_pending."""
        if len(self._pending) == 1:
            return self._pending[0]
        chunks = self._pending
        if len({len(parts) for parts, _ in chunks}) > 1:  # taps given both ways: concatenate each chunk first
            chunks = [((torch.cat(parts, -1),), pos) for parts, pos in chunks]
        parts = tuple(torch.cat([c[0][i] for c in chunks], 1) for i in range(len(chunks[0][0])))
        return parts, torch.cat([pos for _, pos in chunks], 1)


def reorder_last(kvs: list[torch.Tensor], order: torch.Tensor, width: int) -> None:
    """Each kv [R, Hk, C, D] of `kvs` (one C for all): its last `width` columns start with their columns order [R, m],
    in place; the other W - m are left stale (the drafter's context and the target's cache after a draft tree's step
    keep the accepted path; the copy of the whole cache this replaces took ~4-6 ms of a ~120 ms fp32 step under
    cProfile, and grew with the context). Two indexing ops per tensor: one request's columns move with index_select
    and index_copy_ (~6 us per tensor against ~20 us for an expanded gather and a copy into a slice, bf16, 2-core CPU;
    a tree step moves the 60 tensors of SmolLM2's cache), several requests' with advanced indexing (~15-20 us per
    tensor at 2-8 requests, half the gather's)."""
    if not kvs:
        return
    start = kvs[0].shape[2] - width
    src = order + start  # [R, m] absolute columns
    dst = torch.arange(start, start + order.shape[1], device=order.device)  # [m]
    if order.shape[0] == 1:
        for kv in kvs:
            kv.index_copy_(2, dst, kv.index_select(2, src[0]))
        return
    rows = torch.arange(order.shape[0], device=order.device)[:, None]  # [R, 1]
    for kv in kvs:
        kv[rows, :, dst] = kv[rows, :, src]  # [R, m, Hk, D] either side
