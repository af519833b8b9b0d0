"""DraftContext: deferred projection gives the same K/V as projecting every chunk at once, through row selection,
trailing crops (across chunk boundaries and into projected columns) and per-row gathers."""

import torch

from hf_dspark.draft_context import DraftContext
from hf_dspark.kernels import gather_kv

R, H = 3, 64


def chunk(drafter, t, start, seed):
    g = torch.Generator().manual_seed(seed)
    taps = torch.randn(R, t, len(drafter.config.target_layer_ids) * H, generator=g)
    return taps, (start + torch.arange(t)).expand(R, t)


def eager(drafter, taps, positions):
    return drafter.context_kv(drafter.context_features(taps), positions)


def same(a, b):
    assert len(a) == len(b)
    for (k, v), (k2, v2) in zip(a, b):
        assert k.shape == k2.shape and torch.allclose(k, k2, atol=1e-5) and torch.allclose(v, v2, atol=1e-5)


@torch.no_grad()
def test_deferred_projection_matches_eager(tiny_drafter):
    ctx = DraftContext(tiny_drafter)
    chunks = [chunk(tiny_drafter, t, s, i) for i, (t, s) in enumerate([(5, 0), (1, 5), (3, 6), (1, 9)])]
    ref = [eager(tiny_drafter, *c) for c in chunks]
    ref_kv = [(torch.cat([r[i][0] for r in ref], 2), torch.cat([r[i][1] for r in ref], 2)) for i in range(len(ref[0]))]

    ctx.append(*chunks[0])
    same(ctx.kv(), ref[0])  # projected: nothing pending
    assert ctx.num_pending == 0
    for c in chunks[1:]:  # skipped steps: recorded, not projected
        ctx.append(*c)
    assert ctx.num_pending == 5
    ctx.select(torch.tensor([2, 0]))  # rows finish while columns are pending
    ctx.crop(2)  # the last chunk and one column of the one before
    assert ctx.num_pending == 3
    expect = [(k[[2, 0], :, :8], v[[2, 0], :, :8]) for k, v in ref_kv]
    same(ctx.kv(), expect)

    ctx.append(*[x[:2] for x in chunk(tiny_drafter, 2, 8, 9)])
    ctx.crop(4)  # through the pending chunk into projected columns
    same(ctx.kv(), [(k[:, :, :6], v[:, :, :6]) for k, v in expect])

    before = ctx.kv()  # [2, Hk, 6, D]
    extra = [x[:2] for x in chunk(tiny_drafter, 1, 6, 10)]
    ctx.append(*extra)  # still pending when the cache compacts
    full = [(torch.cat([k, ek], 2), torch.cat([v, ev], 2)) for (k, v), (ek, ev) in zip(before, eager(tiny_drafter, *extra))]
    keep = torch.tensor([[0, 2, 6], [1, 3, 4]])  # different columns per row, one of them pending
    ctx.gather(keep)
    assert ctx.num_pending == 0
    same(ctx.kv(), [(gather_kv(k, keep), gather_kv(v, keep)) for k, v in full])


@torch.no_grad()
def test_pending_columns_are_bounded(tiny_drafter):
    ctx = DraftContext(tiny_drafter, max_pending=4)
    first, second = chunk(tiny_drafter, 3, 0, 1), chunk(tiny_drafter, 2, 3, 2)
    ctx.append(*first)
    assert ctx.num_pending == 3
    ctx.append(*second)  # 5 > 4 waiting: projected at once
    assert ctx.num_pending == 0
    kv = [(torch.cat([k, k2], 2), torch.cat([v, v2], 2)) for (k, v), (k2, v2) in zip(eager(tiny_drafter, *first), eager(tiny_drafter, *second))]
    same(ctx.kv(), kv)


@torch.no_grad()
def test_taps_given_per_layer_are_concatenated_when_projected(tiny_drafter):
    """The loop hands over the tapped layers' outputs one by one; they must project like their concatenation,
    through row selection and crops, also mixed with concatenated chunks."""
    m = len(tiny_drafter.config.target_layer_ids)
    chunks = [chunk(tiny_drafter, t, s, i) for i, (t, s) in enumerate([(4, 0), (1, 4), (2, 5)])]
    per_layer = DraftContext(tiny_drafter)
    joined = DraftContext(tiny_drafter)
    for k, (taps, pos) in enumerate(chunks):
        joined.append(taps, pos)
        per_layer.append(taps if k == 1 else list(taps.split(H, dim=-1)), pos)  # chunk 1 given concatenated
    assert per_layer.num_pending == joined.num_pending == 7 and m > 1
    for ctx in (per_layer, joined):
        ctx.select(torch.tensor([0, 2]))
        ctx.crop(1)
    same(per_layer.kv(), joined.kv())
    taps = torch.cat([c[0] for c in chunks], 1)[[0, 2], :6]
    positions = torch.cat([c[1] for c in chunks], 1)[[0, 2], :6]
    same(per_layer.kv(), eager(tiny_drafter, taps, positions))
