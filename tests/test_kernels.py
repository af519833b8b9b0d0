"""hf_dspark.kernels: each Triton kernel against its torch reference, the rejection sampler's exactness,
and the host-side input checks.

Without CUDA the Triton kernels run on CPU tensors in the Triton interpreter (TRITON_INTERPRET=1 must be
set before the kernel modules are imported; ~50 ms per launch, so shapes stay small). With CUDA the same
comparisons run natively on the GPU, plus a few realistic sizes.
"""

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:   # must precede the first import of triton (transformers may import it: see the skip reason)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hf_dspark.kernels import (build_cu_num_draft, build_verify_inputs, exp_noise, first_argmax, flatten_ragged,  # noqa: E402
                               gather_kv, markov_sample_block, rejection_sample, sample_index)
from hf_dspark.kernels.dispatch import HAS_TRITON, INTERPRETED, select_backend  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
needs_triton = pytest.mark.skipif(
    not HAS_TRITON or not (CUDA or INTERPRETED),
    reason="triton is not installed (pip install triton)" if not HAS_TRITON else
    "no CUDA, and triton was imported before TRITON_INTERPRET=1 was set (by another test module's imports); "
    "set it in tests/conftest.py or the environment, or run this file alone")
cuda_only = pytest.mark.skipif(not CUDA, reason="realistic sizes are too slow for the Triton interpreter")


def _id(value):
    return str(value).removeprefix("torch.")


def _gen(seed):
    return torch.Generator(device=DEVICE).manual_seed(seed)


# --------------------------------------------------------------------------------------------
# rejection_sample: Triton vs reference
# --------------------------------------------------------------------------------------------

def _verification_inputs(lens, V, greedy, with_q, dtype, seed, ties=False):
    """Ragged inputs where roughly half the drafts get accepted."""
    g = _gen(seed)
    lens = torch.tensor(lens, dtype=torch.long, device=DEVICE)
    R, D = lens.numel(), int(lens.sum())
    cu = build_cu_num_draft(lens)
    rows = torch.arange(D, device=DEVICE) + torch.repeat_interleave(torch.arange(R, device=DEVICE), lens)
    if ties:   # integer logits: many exact ties, resolved to the smallest index
        logits = torch.randint(0, 3, (D + R, V), generator=g, device=DEVICE).float()
    else:
        logits = 4 * torch.randn(D + R, V, generator=g, device=DEVICE)
    target = logits if greedy else torch.softmax(logits, -1)
    draft_probs = None
    if with_q and not greedy:
        draft_probs = torch.softmax(logits[rows] + 0.7 * torch.randn(D, V, generator=g, device=DEVICE), -1)
        drafts = torch.multinomial(draft_probs, 1, generator=g).squeeze(1) if D else rows
    else:
        guess = torch.randint(0, V, (D,), generator=g, device=DEVICE)
        drafts = torch.where(torch.rand(D, generator=g, device=DEVICE) < 0.7, logits[rows].argmax(-1), guess)
    uniforms = exp_noise = None
    if not greedy:
        uniforms = torch.rand(D, generator=g, device=DEVICE)
        exp_noise = torch.empty(R, V, device=DEVICE).exponential_(generator=g)
    target = target.to(dtype)
    draft_probs = None if draft_probs is None else draft_probs.to(dtype)
    return target, drafts, draft_probs, cu, uniforms, exp_noise


SHAPES = {
    "single": ([5], 300),                        # V = 300: not a multiple of any tile
    "ragged_with_zero_lengths": ([0, 3, 1, 0, 6], 300),
    "all_zero_lengths": ([0, 0, 0], 77),
    "64_requests": ([i % 4 for i in range(64)], 40),
}
REJECTION_CASES = [(shape, mode, drafts, torch.float32) for shape in SHAPES
                   for mode, drafts in [("greedy", "one_hot"), ("sampled", "draft_probs"), ("sampled", "one_hot")]]
REJECTION_CASES += [("ragged_with_zero_lengths", mode, "draft_probs", dtype)
                    for mode in ("greedy", "sampled") for dtype in (torch.float16, torch.bfloat16)]


@needs_triton
@pytest.mark.parametrize("shape,mode,drafts,dtype", REJECTION_CASES, ids=_id)
def test_rejection_sample_triton_matches_reference(shape, mode, drafts, dtype):
    lens, V = SHAPES[shape]
    greedy, with_q = mode == "greedy", drafts == "draft_probs"
    inputs = _verification_inputs(lens, V, greedy, with_q, dtype, seed=len(lens) + V)
    ref_tokens, ref_accepted = rejection_sample(*inputs, greedy, backend="torch", debug=True)
    tokens, accepted = rejection_sample(*inputs, greedy, backend="triton", debug=True)
    assert torch.equal(accepted, ref_accepted)
    assert torch.equal(tokens, ref_tokens)
    if len(lens) > 1 and sum(lens):   # the case exercises both outcomes
        assert 0 < int(ref_accepted.sum()) < sum(lens)


@needs_triton
@pytest.mark.parametrize("greedy", [True, False])
def test_rejection_sample_breaks_ties_like_torch_argmax(greedy):
    inputs = _verification_inputs([2, 0, 3], 300, greedy, False, torch.float32, seed=3, ties=True)
    ref = rejection_sample(*inputs, greedy, backend="torch")
    out = rejection_sample(*inputs, greedy, backend="triton")
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


@cuda_only
@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("R,V", [(1, 151936), (64, 49152)])
def test_rejection_sample_triton_realistic_sizes(greedy, R, V):
    lens = [7 - (i % 8) for i in range(R)]
    inputs = _verification_inputs(lens, V, greedy, True, torch.float32, seed=R)
    ref = rejection_sample(*inputs, greedy, backend="torch")
    out = rejection_sample(*inputs, greedy, backend="triton")
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 49152), (3, 4, 16384), (5, 2048), (2, 1000), (0, 4096)])
def test_first_argmax_is_torch_argmax_ties_and_nan_included(shape, dtype):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randint(-3, 4, shape, generator=g).to(dtype)  # few distinct values: ties in every row
    flat = x.view(-1, shape[-1])
    if flat.shape[0] >= 2:
        flat[0, 7] = flat[0, shape[-1] - 3] = 9  # two far-apart maxima: the first wins
        flat[1] = float("-inf")  # all equal: index 0
    if flat.shape[0] >= 3:
        flat[2, 3000 % shape[-1]] = flat[2, shape[-1] - 1] = float("nan")  # argmax takes the first NaN
    assert torch.equal(first_argmax(x), x.argmax(-1))


def test_rejection_sample_reference_semantics():
    # request 0 drafts [1, 2]: both are the target argmax -> accepted, bonus = argmax of row 2
    # request 1 drafts [0]: the target prefers 2 -> rejected at 0, recovered = argmax = 2
    target = torch.tensor([[0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.7, 0.2, 0.1], [0.2, 0.1, 0.7], [0.3, 0.3, 0.4]])
    cu = torch.tensor([0, 2, 3])
    tokens, accepted = rejection_sample(target, torch.tensor([1, 2, 0]), None, cu, None, None, True, backend="torch")
    assert accepted.tolist() == [2, 0]
    assert tokens.tolist() == [[1, 2, 0], [2, -1, -1]]


# --------------------------------------------------------------------------------------------
# rejection_sample: the output distribution is the target's (chi-square), and a wrong rule is caught
# --------------------------------------------------------------------------------------------

P0 = torch.tensor([0.10, 0.20, 0.30, 0.15, 0.25])
Q0 = torch.tensor([0.40, 0.05, 0.10, 0.35, 0.10])
STAT_BACKENDS = ["torch", pytest.param("triton", marks=[needs_triton, cuda_only])]


def _chisquare_pvalue(tokens, expected_probs):
    from scipy.stats import chisquare
    observed = torch.bincount(tokens.cpu(), minlength=expected_probs.numel()).double()
    expected = expected_probs.double() / expected_probs.double().sum() * observed.sum()
    return chisquare(observed.numpy(), expected.numpy()).pvalue


def _one_draft_trials(n, seed):
    """n independent one-draft verifications with draft x ~ Q0 and target P0 at position 0."""
    g = _gen(seed)
    V = P0.numel()
    p, q = P0.to(DEVICE), Q0.to(DEVICE)
    x = torch.multinomial(q.expand(n, V), 1, replacement=True, generator=g).squeeze(1)
    target = torch.stack([p.expand(n, V), torch.full((n, V), 1 / V, device=DEVICE)], 1).reshape(2 * n, V)
    u = torch.rand(n, generator=g, device=DEVICE)
    noise = torch.empty(n, V, device=DEVICE).exponential_(generator=g)
    return target, x, q.expand(n, V).contiguous(), torch.arange(n + 1, device=DEVICE), u, noise


def _flawed_one_draft_sampler(target, x, draft_probs, u, noise, rule):
    """Textbook mistakes, for showing that the chi-square test catches them."""
    p, q = target[0::2], draft_probs
    p_x, q_x = p.gather(1, x[:, None])[:, 0], q.gather(1, x[:, None])[:, 0]
    if rule == "accept_if_u_below_p":       # ignores q in the accept test
        accept, residual = u < p_x, (p - q).clamp_min(0)
    else:                                   # "resample_from_target": recovers from p, not max(0, p - q)
        accept, residual = u * q_x < p_x, p
    return torch.where(accept, x, (residual / noise).argmax(-1))


@pytest.mark.parametrize("backend", STAT_BACKENDS)
def test_one_draft_output_follows_target_distribution(backend):
    target, x, q, cu, u, noise = _one_draft_trials(100_000, seed=11)
    tokens, accepted = rejection_sample(target, x, q, cu, u, noise, False, backend=backend)
    assert _chisquare_pvalue(tokens[:, 0], P0) > 1e-3
    # acceptance rate is sum_v min(p, q) = 1 - TV(p, q)
    assert abs(accepted.float().mean().item() - torch.minimum(P0, Q0).sum().item()) < 0.01


def test_sample_index_and_exp_noise_draw_the_distributions_they_replace():
    """`sample_index` draws i with probability probs[i] / sum (never a zero entry); argmax(probs / exp_noise) too."""
    torch.manual_seed(0)
    probs = torch.tensor([0.0, 0.2, 0.0, 0.4, 0.6, 0.0, 0.8])  # unnormalised, zeros inside and at the end
    draws = torch.tensor([sample_index(probs) for _ in range(20_000)])
    support = torch.tensor([1, 3, 4, 6])
    position = torch.full((probs.numel(),), -1).index_put_((support,), torch.arange(4))  # support index of a token
    assert set(draws.unique().tolist()) == set(support.tolist())
    assert _chisquare_pvalue(position[draws], probs[support]) > 1e-3
    noise = exp_noise(50_000, probs.numel())
    assert bool((noise > 0).all()) and abs(noise.mean().item() - 1.0) < 0.01  # Exp(1): mean 1
    assert _chisquare_pvalue(position[(probs / noise).argmax(-1)], probs[support]) > 1e-3
    assert sample_index(torch.tensor([0.0, 0.0, 1.0])) == 2


@pytest.mark.parametrize("rule", ["accept_if_u_below_p", "resample_from_target"])
def test_chisquare_detects_a_wrong_acceptance_rule(rule):
    target, x, q, cu, u, noise = _one_draft_trials(100_000, seed=11)
    assert _chisquare_pvalue(_flawed_one_draft_sampler(target, x, q, u, noise, rule), P0) < 1e-6


@pytest.mark.parametrize("backend", STAT_BACKENDS)
def test_two_draft_output_pairs_follow_target_distribution(backend):
    """Drafts x0 ~ q0, x1 ~ q1(.|x0); target p0 then p1(.|x0). The first two committed tokens (taking
    one more plain decode step when only one was emitted) must follow p0(a) p1(b|a)."""
    n, V = 200_000, P0.numel()
    g = _gen(5)
    table = torch.Generator().manual_seed(0)
    p1 = torch.softmax(2 * torch.randn(V, V, generator=table), -1).to(DEVICE)     # p1[a] = p(. | a)
    q1 = torch.softmax(2 * torch.randn(V, V, generator=table), -1).to(DEVICE)
    p0, q0 = P0.to(DEVICE), Q0.to(DEVICE)
    x0 = torch.multinomial(q0.expand(n, V), 1, replacement=True, generator=g).squeeze(1)
    x1 = torch.multinomial(q1[x0], 1, generator=g).squeeze(1)
    bonus_row = torch.full((n, V), 1 / V, device=DEVICE)
    target = torch.stack([p0.expand(n, V), p1[x0], bonus_row], 1).reshape(3 * n, V)
    draft_probs = torch.stack([q0.expand(n, V), q1[x0]], 1).reshape(2 * n, V)
    cu = torch.arange(0, 2 * n + 1, 2, device=DEVICE)
    u = torch.rand(2 * n, generator=g, device=DEVICE)
    noise = torch.empty(n, V, device=DEVICE).exponential_(generator=g)
    tokens, accepted = rejection_sample(target, torch.stack([x0, x1], 1).reshape(-1), draft_probs, cu, u, noise,
                                        False, backend=backend)
    first = tokens[:, 0]
    # requests that emitted a single token take a plain decode step (no drafts) for the second
    noise2 = torch.empty(n, V, device=DEVICE).exponential_(generator=g)
    follow_up, _ = rejection_sample(p1[first], torch.empty(0, dtype=torch.long, device=DEVICE), None,
                                    torch.zeros(n + 1, dtype=torch.long, device=DEVICE), None, noise2, False,
                                    backend=backend)
    second = torch.where(accepted > 0, tokens[:, 1], follow_up[:, 0])
    assert _chisquare_pvalue(first * V + second, (p0[:, None] * p1).reshape(-1).cpu()) > 1e-3
    assert int((accepted == 2).sum()) > 0 and int((accepted == 0).sum()) > 0


# --------------------------------------------------------------------------------------------
# markov_sample_block: Triton vs reference
# --------------------------------------------------------------------------------------------

def _markov_inputs(R, B, V, H, rank, temperature, head, dtype, seed):
    g = _gen(seed)
    base = (3 * torch.randn(R, B, V, generator=g, device=DEVICE)).to(dtype)
    hidden = torch.randn(R, B, H, generator=g, device=DEVICE).to(dtype)
    anchors = torch.randint(0, V, (R,), generator=g, device=DEVICE)
    markov = head != "dflash"
    w1 = (0.5 * torch.randn(V, rank, generator=g, device=DEVICE)).to(dtype) if markov else None
    w2 = (0.2 * torch.randn(V, rank, generator=g, device=DEVICE)).to(dtype) if markov else None
    conf_len = {"markov+conf": H + rank, "markov+hidden_conf": H, "dflash": H, "markov": None}[head]
    conf_w = None if conf_len is None else 0.1 * torch.randn(1, conf_len, generator=g, device=DEVICE)
    conf_b = torch.tensor([0.3], device=DEVICE)
    noise = torch.empty(R, B, V, device=DEVICE).exponential_(generator=g) if temperature else None
    return base, hidden, anchors, w1, w2, conf_w, conf_b, temperature, noise


MARKOV_SHAPES = {"single": (1, 4, 300, 40, 32), "ragged_5": (5, 4, 300, 40, 32), "64_requests": (64, 3, 50, 24, 16)}
MARKOV_CASES = [(shape, t, "markov+conf", torch.float32) for shape in MARKOV_SHAPES for t in (0.0, 0.7)]
MARKOV_CASES += [("ragged_5", 1.0, "markov+hidden_conf", torch.float32), ("ragged_5", 0.0, "markov", torch.float32),
                 ("ragged_5", 0.0, "dflash", torch.float32), ("ragged_5", 0.8, "dflash", torch.float32),
                 ("ragged_5", 0.0, "markov+conf", torch.bfloat16), ("ragged_5", 0.6, "markov+conf", torch.float16),
                 ("single", 0.9, "markov+conf", torch.bfloat16)]
if CUDA:
    MARKOV_SHAPES["realistic"] = (16, 7, 49152, 4096, 256)
    MARKOV_CASES += [("realistic", t, "markov+conf", dt) for t in (0.0, 1.0) for dt in (torch.float32, torch.bfloat16)]


def _assert_markov_close(out, ref, dtype):
    assert torch.equal(out[0], ref[0])
    # half weights: the Markov bias is rounded to the weight dtype, and a different fp32 summation
    # order can land a few logits one half-precision ulp apart
    rtol = 1e-4 if dtype == torch.float32 else 2e-2
    for got, want in zip(out[1:], ref[1:]):
        assert (got is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(got, want, rtol=rtol, atol=1e-5)


@needs_triton
@pytest.mark.parametrize("shape,temperature,head,dtype", MARKOV_CASES, ids=_id)
def test_markov_sample_block_triton_matches_reference(shape, temperature, head, dtype):
    inputs = _markov_inputs(*MARKOV_SHAPES[shape], temperature, head, dtype, seed=len(shape))
    ref = markov_sample_block(*inputs, backend="torch", debug=True)
    out = markov_sample_block(*inputs, backend="triton", debug=True)
    _assert_markov_close(out, ref, dtype)
    assert (ref[1] is None) == (temperature == 0)
    assert (ref[2] is None) == (head == "markov")


def test_markov_sample_block_reference_uses_previous_token():
    # V = 3, rank 1: the Markov bias makes token (prev + 1) % 3 win whatever the base logits say
    w1 = torch.tensor([[0.0], [1.0], [2.0]])
    w2 = torch.tensor([[1.0], [-1.0], [0.0]])          # bias for prev=0: [0,0,0]; prev=1: [1,-1,0]; prev=2: [2,-2,0]
    base = torch.tensor([[[0.0, 0.5, 0.0], [0.0, 0.0, 0.9], [0.0, 0.0, 0.0]]])
    tokens, q, conf = markov_sample_block(base, None, torch.tensor([0]), w1, w2, None, None, 0.0, None,
                                          backend="torch")
    assert tokens.tolist() == [[1, 0, 0]] and q is None and conf is None


def _reduced_vocab_inputs(R, B, V, D, H, rank, temperature, seed):
    """A drafter over D of V tokens: logits, W2 and noise over the D draft ids, W1 over all V (target ids)."""
    g = _gen(seed)
    base, hidden, anchors, w1, w2, conf_w, conf_b, temperature, noise = _markov_inputs(
        R, B, D, H, rank, temperature, "markov+conf", torch.float32, seed)
    w1 = 0.5 * torch.randn(V, rank, generator=g, device=DEVICE)
    anchors = torch.randint(0, V, (R,), generator=g, device=DEVICE)
    draft_ids = torch.randperm(V, generator=g, device=DEVICE)[:D]  # any order: draft id i proposes draft_ids[i]
    return (base, hidden, anchors, w1, w2, conf_w, conf_b, temperature, noise), draft_ids


@needs_triton
@pytest.mark.parametrize("R", [1, 5])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_markov_sample_block_reduced_vocab_triton_matches_reference(R, temperature):
    inputs, draft_ids = _reduced_vocab_inputs(R, 4, 300, 120, 40, 32, temperature, seed=R)
    ref = markov_sample_block(*inputs, draft_ids=draft_ids, backend="torch", debug=True)
    out = markov_sample_block(*inputs, draft_ids=draft_ids, backend="triton", debug=True)
    _assert_markov_close(out, ref, torch.float32)
    assert bool(torch.isin(ref[0], draft_ids).all())  # target ids, all of them draftable
    assert ref[1] is None or ref[1].shape == (R, 4, 120)  # q over the draft vocabulary


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_reduced_vocab_sampler_is_the_full_vocab_sampler_with_zero_mass_outside(temperature):
    """Sampling over D draft ids then mapping them == sampling over V with -inf logits (q = 0) outside the draft ids."""
    (base, hidden, anchors, w1, w2, conf_w, conf_b, t, noise), draft_ids = _reduced_vocab_inputs(
        3, 4, 50, 20, 8, 4, temperature, seed=3)
    tokens, q, conf = markov_sample_block(base, hidden, anchors, w1, w2, conf_w, conf_b, t, noise, draft_ids=draft_ids,
                                          backend="torch")
    full_base = base.new_full((3, 4, 50), float("-inf")).index_copy_(-1, draft_ids, base)
    full_w2 = w2.new_zeros(50, 4).index_copy_(0, draft_ids, w2)
    full_noise = None if noise is None else noise.new_ones(3, 4, 50).index_copy_(-1, draft_ids, noise)
    ref_tokens, ref_q, ref_conf = markov_sample_block(full_base, hidden, anchors, w1, full_w2, conf_w, conf_b, t,
                                                      full_noise, backend="torch")
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(conf, ref_conf)
    if temperature:
        torch.testing.assert_close(ref_q[..., draft_ids], q)
        outside = torch.ones(50, dtype=torch.bool, device=DEVICE)
        outside[draft_ids] = False
        assert float(ref_q[..., outside].abs().max()) == 0.0


def test_reduced_vocab_sampler_refuses_bad_maps():
    inputs, draft_ids = _reduced_vocab_inputs(2, 3, 30, 10, 4, 2, 0.0, seed=0)
    with pytest.raises(ValueError, match="draft_ids must be an integer \\[D\\] tensor with D = 10"):
        markov_sample_block(*inputs, draft_ids=draft_ids[:9], backend="torch")
    with pytest.raises(ValueError, match="draft_ids must be an integer"):
        markov_sample_block(*inputs, draft_ids=draft_ids.float(), backend="torch")
    with pytest.raises(ValueError, match="draft_ids holds ids"):
        markov_sample_block(*inputs, draft_ids=draft_ids + 30, backend="torch", debug=True)


# --------------------------------------------------------------------------------------------
# layout helpers: Triton vs reference
# --------------------------------------------------------------------------------------------

@needs_triton
def test_build_verify_inputs_triton_matches_reference():
    g = _gen(0)
    anchors = torch.randint(0, 100, (5,), generator=g, device=DEVICE)
    drafts = torch.randint(0, 100, (5, 7), generator=g, device=DEVICE)
    num_verify = torch.tensor([0, 3, 7, 1, 0], device=DEVICE)
    start = torch.randint(0, 50, (5,), generator=g, device=DEVICE)
    ref = build_verify_inputs(anchors, drafts, num_verify, start, -5, backend="torch", debug=True)
    out = build_verify_inputs(anchors, drafts, num_verify, start, -5, backend="triton", debug=True)
    for got, want in zip(out, ref):
        assert torch.equal(got, want)
    assert ref[0][1].tolist() == [anchors[1].item(), *drafts[1, :3].tolist(), -5, -5, -5, -5]
    assert ref[1][1].tolist() == list(range(start[1].item(), start[1].item() + 8))
    assert ref[2].sum(1).tolist() == [1, 4, 8, 2, 1]


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_id)
def test_gather_kv_triton_matches_reference(dtype):
    g = _gen(1)
    kv = torch.randn(3, 2, 20, 24, generator=g, device=DEVICE).to(dtype)
    keep = torch.stack([torch.randperm(20, generator=g, device=DEVICE)[:13].sort().values for _ in range(3)])
    ref = gather_kv(kv, keep, backend="torch", debug=True)
    assert torch.equal(ref[1, 1, 4], kv[1, 1, keep[1, 4]])
    assert torch.equal(gather_kv(kv, keep, backend="triton", debug=True), ref)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_id)
def test_flatten_ragged_triton_matches_reference(dtype):
    g = _gen(2)
    num_verify = torch.tensor([0, 3, 7, 1, 0], device=DEVICE)
    rows = torch.randn(5, 10, 300, generator=g, device=DEVICE).to(dtype)[:, 2:]    # strided view, L + 1 = 8
    ref = flatten_ragged(rows, num_verify, backend="torch", debug=True)
    assert ref.shape == (int(num_verify.sum()) + 5, 300)
    assert torch.equal(ref[1], rows[1, 0]) and torch.equal(ref[4], rows[1, 3])
    assert torch.equal(flatten_ragged(rows, num_verify, backend="triton", debug=True), ref)


def test_flatten_ragged_keeps_each_requests_verified_rows():
    rows = torch.randn(3, 4, 5, generator=_gen(3), device=DEVICE)
    flat = flatten_ragged(rows, torch.tensor([2, 0, 3], device=DEVICE), backend="torch", debug=True)
    assert torch.equal(flat, torch.cat([rows[0, :3], rows[1, :1], rows[2, :4]]))
    plain = flatten_ragged(rows[:, :1], torch.zeros(3, dtype=torch.long, device=DEVICE), backend="torch", debug=True)
    assert torch.equal(plain, rows[:, 0])  # a plain step: the one position of each request
    full = flatten_ragged(rows, torch.full((3,), 3, device=DEVICE), backend="torch", debug=True)
    assert torch.equal(full, rows.reshape(12, 5))  # every request keeps all its rows (a full chain)


# --------------------------------------------------------------------------------------------
# empty batches, backend selection, debug checks
# --------------------------------------------------------------------------------------------

BACKENDS = ["torch", pytest.param("triton", marks=needs_triton)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch_returns_empty_outputs(backend):
    empty_long = torch.empty(0, dtype=torch.long, device=DEVICE)
    tokens, accepted = rejection_sample(torch.empty(0, 11, device=DEVICE), empty_long, None,
                                        torch.zeros(1, dtype=torch.long, device=DEVICE), empty_long.float(),
                                        torch.empty(0, 11, device=DEVICE), False, backend=backend, debug=True)
    assert tokens.shape == (0, 1) and accepted.shape == (0,)
    tokens, q, conf = markov_sample_block(torch.empty(0, 4, 11, device=DEVICE), torch.empty(0, 4, 6, device=DEVICE),
                                          empty_long, torch.randn(11, 3, device=DEVICE),
                                          torch.randn(11, 3, device=DEVICE), torch.randn(9, device=DEVICE), 0.0,
                                          0.5, torch.empty(0, 4, 11, device=DEVICE), backend=backend, debug=True)
    assert tokens.shape == (0, 4) and q.shape == (0, 4, 11) and conf.shape == (0, 4)
    ids, pos, valid = build_verify_inputs(empty_long, torch.empty(0, 7, dtype=torch.long, device=DEVICE),
                                          empty_long, empty_long, 0, backend=backend, debug=True)
    assert ids.shape == pos.shape == valid.shape == (0, 1)
    assert gather_kv(torch.randn(0, 2, 5, 4, device=DEVICE), torch.empty(0, 3, dtype=torch.long, device=DEVICE),
                     backend=backend).shape == (0, 2, 3, 4)
    assert flatten_ragged(torch.randn(0, 3, 11, device=DEVICE), empty_long, backend=backend).shape == (0, 11)


def test_backend_selection(monkeypatch):
    cpu = torch.zeros(1)
    monkeypatch.setenv("HF_DSPARK_KERNELS", "torch")
    assert select_backend(None, cpu) == "torch"
    monkeypatch.setenv("HF_DSPARK_KERNELS", "auto")
    assert select_backend(None, cpu) == "torch"         # CPU tensors: the reference is the fast path
    assert select_backend("torch", cpu) == "torch"
    with pytest.raises(ValueError, match="Unknown kernel backend"):
        select_backend("cuda", cpu)


def _good_verification():
    return _verification_inputs([2, 1], 6, False, True, torch.float32, seed=0)


def _bad(**changes):
    target, drafts, draft_probs, cu, u, noise = _good_verification()
    args = dict(target_probs=target, draft_token_ids=drafts, draft_probs=draft_probs, cu_num_draft=cu,
                uniforms=u, exp_noise=noise, greedy=False)
    args.update(changes)
    return args


DEBUG_ERRORS = {
    "cu_num_draft_wrong_total": (dict(cu_num_draft=torch.tensor([0, 1, 4], device=DEVICE)), "ends at 4"),
    "cu_num_draft_not_from_zero": (dict(cu_num_draft=torch.tensor([1, 2, 3], device=DEVICE)), "start at 0"),
    "draft_id_out_of_range": (dict(draft_token_ids=torch.tensor([0, 6, 1], device=DEVICE)), "outside the vocab"),
    "target_rows_not_probabilities": (dict(target_probs=torch.ones(5, 6, device=DEVICE)), "row sum"),
    "draft_rows_not_probabilities": (dict(draft_probs=torch.ones(3, 6, device=DEVICE)), "row sum"),
}
SHAPE_ERRORS = {
    "target_rows_vs_drafts": (dict(target_probs=torch.full((4, 6), 1 / 6, device=DEVICE)), "need 5"),
    "draft_probs_shape": (dict(draft_probs=torch.full((2, 6), 1 / 6, device=DEVICE)), "must be \\[D, V\\]"),
    "missing_noise": (dict(exp_noise=None), "needs uniforms"),
}


@pytest.mark.parametrize("case", DEBUG_ERRORS)
def test_debug_checks_reject_bad_verification_inputs(case, monkeypatch):
    changes, message = DEBUG_ERRORS[case]
    with pytest.raises(ValueError, match=message):
        rejection_sample(**_bad(**changes), backend="torch", debug=True)
    monkeypatch.setenv("HF_DSPARK_DEBUG", "1")
    with pytest.raises(ValueError, match=message):
        rejection_sample(**_bad(**changes), backend="torch")


@pytest.mark.parametrize("case", SHAPE_ERRORS)
def test_shape_checks_always_run(case):
    changes, message = SHAPE_ERRORS[case]
    with pytest.raises(ValueError, match=message):
        rejection_sample(**_bad(**changes), backend="torch", debug=False)


def test_debug_checks_reject_bad_ids_in_other_kernels():
    inputs = list(_markov_inputs(2, 3, 10, 4, 2, 0.0, "markov+conf", torch.float32, seed=0))
    inputs[2] = torch.tensor([3, 10], device=DEVICE)
    with pytest.raises(ValueError, match="anchor_ids holds ids"):
        markov_sample_block(*inputs, backend="torch", debug=True)
    with pytest.raises(ValueError, match="conf_weight has 5 entries"):
        markov_sample_block(*inputs[:5], torch.ones(5, device=DEVICE), *inputs[6:], backend="torch")
    with pytest.raises(ValueError, match="keep_index must hold"):
        gather_kv(torch.randn(1, 1, 4, 2, device=DEVICE), torch.tensor([[0, 4]], device=DEVICE), debug=True)
    with pytest.raises(ValueError, match="num_verify must lie"):
        build_verify_inputs(torch.zeros(1, dtype=torch.long, device=DEVICE),
                            torch.zeros(1, 3, dtype=torch.long, device=DEVICE),
                            torch.tensor([4], device=DEVICE), torch.zeros(1, dtype=torch.long, device=DEVICE), 0)
