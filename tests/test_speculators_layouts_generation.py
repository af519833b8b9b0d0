"""Generation with speculators' layouts stays exact. A reduced-vocabulary drafter (draft_vocab_size D < V): greedy
output equals plain generate() token for token (batch 1 and ragged; fused sampler and the general path), and sampled
output follows the target's joint distribution although the drafter gives zero mass to most of the vocabulary (the
residual max(0, p - q) supplies those tokens). Sliding-window layers and the z-lab block layout: greedy exact."""

from __future__ import annotations


import pytest
import torch
import _sampling
from conftest import make_tiny_drafter, make_tiny_target
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

from hf_dspark.testing import ragged_batch


def reduced_drafter(target, draft_ids: torch.Tensor, seed: int = 0, **overrides):
    drafter = make_tiny_drafter(target, seed=seed, draft_vocab_size=int(draft_ids.numel()), **overrides)
    drafter.set_draft_vocab(draft_ids)
    return drafter


@pytest.mark.parametrize("path", ["fused", "general"])
@pytest.mark.parametrize("batch", ["one", "ragged"])
def test_greedy_identical_with_a_reduced_vocabulary(tiny_target, path, batch):
    # the drafter proposes only 96 of the 256 tokens, most of them ones the target picks, so drafts get accepted
    enc = ragged_batch(256)
    if batch == "one":
        enc = {k: v[:1, (enc["attention_mask"][0] == 0).sum():] for k, v in enc.items()}
    ref = tiny_target.generate(**enc, max_new_tokens=30, do_sample=False, eos_token_id=None)
    seen = torch.unique(ref).tolist()
    rest = [i for i in range(255) if i not in seen]
    draft_ids = torch.tensor((seen + rest)[:96])
    kw = dict(markov_rank=16) if path == "fused" else dict(markov_rank=16, markov_head_type="gated")
    drafter = reduced_drafter(tiny_target, draft_ids, **kw)
    out = tiny_target.generate(**enc, max_new_tokens=30, do_sample=False, eos_token_id=None, assistant_model=drafter)
    assert torch.equal(out, ref)
    assert drafter.last_stats.drafted_steps > 0


@pytest.mark.parametrize("head", ["vanilla", "rnn"])
def test_greedy_identical_with_sliding_layers_and_the_zlab_layout(tiny_target, head):
    enc = ragged_batch(256)
    ref = tiny_target.generate(**enc, max_new_tokens=30, do_sample=False, eos_token_id=None)
    drafter = reduced_drafter(tiny_target, torch.arange(3, 203), markov_head_type=head, num_hidden_layers=2,
                              layer_types=["sliding_attention", "full_attention"], sliding_window=6,
                              sample_from_anchor=False, block_size=5)
    out = tiny_target.generate(**enc, max_new_tokens=30, do_sample=False, eos_token_id=None, assistant_model=drafter)
    assert torch.equal(out, ref)
    assert drafter.last_stats.drafted_steps > 0


V_SMALL, N_TOKENS, SAMPLES = 6, 3, 6000


def exact_joint(model, prompt, warpers) -> torch.Tensor:
    return _sampling.exact_joint(model, prompt, warpers, V_SMALL, N_TOKENS)


@pytest.mark.parametrize("path", ["fused", "general"])
def test_sampling_with_a_reduced_vocabulary_matches_the_target_distribution(path):
    target = make_tiny_target(seed=7, vocab_size=V_SMALL, eos_token_id=None, pad_token_id=0, bos_token_id=None)
    drafter = reduced_drafter(target, torch.tensor([4, 0, 2]), seed=8, mask_token_id=V_SMALL - 1, markov_rank=4)
    prompt = torch.tensor([[1, 2, 3, 4]])
    kw = dict(temperature=0.8) if path == "fused" else dict(temperature=0.8, top_k=4)
    warpers = [TemperatureLogitsWarper(0.8)] + ([TopKLogitsWarper(4)] if path == "general" else [])
    torch.manual_seed(1234)
    ids = prompt.expand(SAMPLES, -1).contiguous()
    out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_TOKENS, do_sample=True,
                          assistant_model=drafter, **kw)
    tokens = out[:, -N_TOKENS:]
    counts = torch.bincount((tokens * torch.tensor([V_SMALL**2, V_SMALL, 1])).sum(1), minlength=V_SMALL**N_TOKENS).float()
    assert _sampling.chi_square_pvalue(counts, exact_joint(target, prompt, warpers)) > 1e-3
    assert drafter.last_stats.accepted_tokens > 0  # drafts were accepted ...
    assert bool(torch.isin(tokens, torch.tensor([1, 3])).any())  # ... and tokens the drafter cannot propose appear
