"""The DSpark decoding loop: exactness (greedy token-for-token, sampling in distribution), every entry point,
stopping, streaming, statistics and bad input."""

from __future__ import annotations

import contextlib
import itertools
import math
import os

import pytest
import torch
import _sampling
from conftest import CollectStreamer, make_tiny_drafter, make_tiny_target
from transformers import pipeline
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

import hf_dspark
import hf_dspark.drafting as drafting
import hf_dspark.generation as G
from hf_dspark.attention import SDPA_FORCE_GQA
from hf_dspark.scheduler import AdaptiveVerification, ConfidenceThreshold, FixedLength, FullBlock, VerifyPolicy
from hf_dspark.step_table import StepTimeTable
from hf_dspark.testing import FixedStepCosts, oracle_drafts, ragged_batch, synthetic_drafts


@pytest.fixture
def oracle():
    """`oracle(reference)` makes the drafter propose the reference continuation with one corrupted token
    (hf_dspark.testing.oracle_drafts) until the test ends."""
    stack = contextlib.ExitStack()
    yield lambda reference, seed=0: stack.enter_context(oracle_drafts(reference, seed))
    stack.close()


# ------------------------------------------------------------------------------------------------ greedy exactness
@pytest.mark.parametrize("compact_holes", [32, 1])
def test_greedy_identical_tiny_ragged_batch(tiny_target, tiny_drafter, oracle, monkeypatch, compact_holes):
    monkeypatch.setattr(G, "COMPACT_HOLES", compact_holes)
    enc = ragged_batch(256)
    ref = tiny_target.generate(**enc, max_new_tokens=40, do_sample=False, eos_token_id=None)
    for drafts in ("random", "oracle"):
        if drafts == "oracle":
            oracle(ref)
        out = tiny_target.generate(**enc, max_new_tokens=40, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter,
                                   adaptive_verification=False)  # the chain (4 prompts verify trees by default)
        assert torch.equal(out, ref), drafts
        if drafts == "oracle":
            assert tiny_drafter.last_stats.mean_accepted_length > 3.0



def test_prompts_of_very_different_lengths_do_not_compact_the_cache_every_step(tiny_target, tiny_drafter, monkeypatch):
    """Left padding is a hole compaction cannot remove: prompts 200 tokens apart must not gather the whole cache on
    every plain step (they did, whenever some row had 4 x COMPACT_HOLES holes)."""
    enc = ragged_batch(256, lengths=(3, 203))
    ref = tiny_target.generate(**enc, max_new_tokens=12, do_sample=False, eos_token_id=None)
    gathers = []
    monkeypatch.setattr(G, "gather_kv", lambda kv, keep: gathers.append(1) or kv.gather(2, keep[:, None, :, None].expand(-1, kv.shape[1], -1, kv.shape[3])))
    out = tiny_target.generate(**enc, max_new_tokens=12, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter, verify_policy=FixedLength(0))
    assert torch.equal(out, ref) and gathers == []


def test_no_attention_mask_while_no_row_has_a_hole_and_exact_once_rejections_leave_holes(tiny_target, tiny_drafter, oracle):
    """Like generate(), the loop passes no attention mask while every cache column is valid in every row (handling
    an all-ones mask cost ~0.5 ms of a 61 ms batch-1 forward); drafts rejected at different positions per row leave
    holes, which bring the mask back (without it this batch's output changes)."""
    enc = ragged_batch(256, lengths=(9, 9, 9))  # no padding
    ref = tiny_target.generate(**enc, max_new_tokens=30, do_sample=False, eos_token_id=None)
    oracle(ref)
    unmasked = []  # per target forward: whether it ran without an attention mask
    hook = tiny_target.register_forward_pre_hook(lambda m, a, kw: unmasked.append(kw.get("attention_mask") is None), with_kwargs=True)
    try:
        out = tiny_target.generate(**enc, max_new_tokens=30, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter,
                                   adaptive_verification=False)  # chains: a tree's step always has its 4D mask
        plain = tiny_target.generate(**enc, max_new_tokens=8, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter, verify_policy=FixedLength(0))
    finally:
        hook.remove()
    assert torch.equal(out, ref) and torch.equal(plain, ref[:, : plain.shape[1]])
    steps = tiny_drafter.last_stats.steps + 1  # the plain call's forwards, prefill included
    drafted = unmasked[:-steps]
    assert drafted[:2] == [True, True] and False in drafted  # unmasked until a rejection left holes in some row
    assert unmasked[-steps:] == [True] * steps


@pytest.mark.parametrize("regime", ["skip", "skip_compacting", "mid_depth"])
def test_greedy_identical_when_the_scheduler_skips_drafting_or_drafts_shallow(tiny_target, tiny_drafter, regime, monkeypatch):
    if regime == "skip_compacting":  # compaction with columns still pending in the drafter context
        monkeypatch.setattr(G, "COMPACT_HOLES", 1)
        regime = "skip"
    enc = ragged_batch(256, seed=5)
    ref = tiny_target.generate(**enc, max_new_tokens=30, do_sample=False, eos_token_id=None)
    policy = skipping_policy() if regime == "skip" else mid_depth_policy()
    with synthetic_drafts(ref, 0.9):  # calibrated confidence 0.9 per token
        out = tiny_target.generate(**enc, max_new_tokens=30, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter, verify_policy=policy)
    assert torch.equal(out, ref)
    stats = tiny_drafter.last_stats
    assert stats.accepted_tokens > 0 and len(stats.step_seconds) == stats.steps
    depths = [int(v.max()) for v in stats.num_verified]  # per drafted step
    assert depths[0] == tiny_drafter.config.block_size  # warm-up: the full block
    if regime == "skip":
        assert 1 < stats.drafted_steps < stats.steps  # the warm-up, then probes between skipped steps
    else:  # expected tokens per second (1 + 0.9 + ... + 0.9^L) / (1 + L / 2) peak at L = 3
        assert max(depths[1:]) == 3
        left, accepted = [29] * 4, iter(stats.accepted_lengths)  # tokens each request may still emit
        for step, (n, verified) in enumerate(zip(stats.rows_per_step, stats.verified_per_step)):
            if n < 4:
                break
            if min(left) > 3:  # every request can use 3 drafts: the scheduler drafts (near the end, drafts that
                assert verified == (7 if step == 0 else 3)  # cannot commit are not worth their price)
            left = [x - next(accepted) for x in left]
        assert step > 3


def test_the_first_drafting_step_after_plain_steps_reports_its_catch_up(tiny_target, tiny_drafter):
    """The drafter context columns that the prefill and plain steps left are projected by the next drafting step:
    the loop tells the policy how many wait before each step, and what that catch-up cost, apart from the step."""

    class Scripted(VerifyPolicy):
        def __init__(self, depths):
            self.depths, self.pending, self.observed = iter(depths), [], []

        def draft_depth(self, num_requests, block_size, usable=None, pending_columns=0):
            self.pending.append(pending_columns)
            return next(self.depths, 0)

        def observe_step(self, num_requests, depth, step_seconds, draft_seconds, accepted=None, catch_up=None):
            self.observed.append((depth, catch_up, draft_seconds))

        def _lengths(self, conf_logits, num_requests, block_size):
            return torch.full((num_requests,), block_size, dtype=torch.long)

    B = tiny_drafter.config.block_size
    enc = {"input_ids": torch.arange(2, 22)[None]}  # 20 prompt tokens, one request
    policy = Scripted([0] * 5 + [B, B, 0, 1])
    tiny_target.generate(**enc, max_new_tokens=30, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter, verify_policy=policy)
    assert policy.pending[:6] == [20, 21, 22, 23, 24, 25]  # the prompt, then one column per plain step
    depth, catch_up, draft_seconds = policy.observed[5]
    assert depth == B and catch_up[0] == 25 and 0 < catch_up[1] <= draft_seconds
    assert policy.pending[6] <= B + 1 and policy.observed[6][1] is None  # a drafting step after a drafting step
    assert policy.observed[8][0] == 1 and policy.observed[8][1] is None  # its columns and one plain step's: no catch-up
    assert all(c is None for d, c, _ in policy.observed if d == 0)


def test_synthetic_drafts_have_the_requested_quality_and_stay_exact(tiny_target, tiny_drafter):
    enc = ragged_batch(256, seed=7)
    ref = tiny_target.generate(**enc, max_new_tokens=40, do_sample=False, eos_token_id=None)
    taus = {}
    for alpha in (0.2, 0.9):
        with synthetic_drafts(ref, alpha):
            out = tiny_target.generate(**enc, max_new_tokens=40, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter, adaptive_verification=False)
        assert torch.equal(out, ref)
        taus[alpha] = tiny_drafter.last_stats.mean_accepted_length
        conf = torch.cat(tiny_drafter.last_stats.conf_logits)
        conf = conf[~conf.isnan()]  # NaN: slots past a step's depth (capped near max_new_tokens)
        assert torch.allclose(torch.sigmoid(conf), torch.full_like(conf, alpha))
    assert taus[0.2] < 1.6 < 2.5 < taus[0.9]


def test_synthetic_drafts_draw_the_luck_once_per_position(tiny_target, tiny_drafter):
    """Which drafted positions are wrong depends on (seed, row, position) only, so policies drafting different depths
    under one seed meet the same luck: on the first step a depth-3 draft accepts min(what the full block accepts,
    3) in every row. Another seed is another draw."""
    enc = ragged_batch(256, seed=7)
    ref = tiny_target.generate(**enc, max_new_tokens=20, do_sample=False, eos_token_id=None)
    R = ref.shape[0]

    def first_step(policy, seed):
        with synthetic_drafts(ref, 0.7, seed=seed):
            tiny_target.generate(**enc, max_new_tokens=20, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter, verify_policy=policy)
        return [a - 1 for a in tiny_drafter.last_stats.accepted_lengths[:R]]  # accepted drafts per row

    full, three = first_step(FullBlock(), 5), first_step(FixedLength(3), 5)
    assert three == [min(a, 3) for a in full]
    assert any(a < 7 for a in full)  # some row met a wrong draft, so the comparison says something
    assert [first_step(FullBlock(), s) for s in (6, 7, 8)] != [full] * 3


def test_greedy_identical_with_processors(tiny_target, tiny_drafter, oracle):
    """Processors that read input_ids (repetition penalty, no-repeat-ngram) see each row's exact prefix."""
    enc = ragged_batch(256, seed=3)
    kw = dict(max_new_tokens=30, do_sample=False, eos_token_id=None, repetition_penalty=1.3, no_repeat_ngram_size=3)
    ref = tiny_target.generate(**enc, **kw)
    oracle(ref)
    out = tiny_target.generate(**enc, **kw, custom_generate=hf_dspark.generate, drafter=tiny_drafter)
    assert torch.equal(out, ref)


@pytest.mark.real
def test_real_smollm2_every_entry_point(smollm2, oracle, tmp_path):
    model, tok = smollm2
    drafter = make_tiny_drafter(model, mask_token_id=16, markov_rank=32)
    prompts = ["What is 12 * 7?", "Write a Python function that reverses a string.", "Hi!", "Name three colors of the rainbow."]
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True) for p in prompts]
    kw = dict(max_new_tokens=24, do_sample=False)
    for batch in (texts[:1], texts):
        enc = tok(batch, return_tensors="pt", padding=True)
        ref = model.generate(**enc, **kw)
        assert torch.equal(model.generate(**enc, **kw, assistant_model=drafter), ref)
        assert torch.equal(model.generate(**enc, **kw, custom_generate=hf_dspark.generate, drafter=drafter), ref)
        oracle(ref, seed=len(batch))
        assert torch.equal(model.generate(**enc, **kw, assistant_model=drafter), ref)
        assert drafter.last_stats.mean_accepted_length > 3.0

    # custom_generate from a drafter folder (the Hub-repo layout), trust_remote_code as transformers requires
    drafter.save_pretrained(tmp_path / "drafter")
    enc = tok(texts, return_tensors="pt", padding=True)
    ref = model.generate(**enc, **kw)
    out = model.generate(**enc, **kw, custom_generate=str(tmp_path / "drafter"), trust_remote_code=True, drafter=drafter)
    assert torch.equal(out, ref)

    # pipelines, batched
    pipe = pipeline("text-generation", model=model, tokenizer=tok)
    plain = pipe(texts, batch_size=2, **kw)
    assisted = pipe(texts, batch_size=2, assistant_model=drafter, **kw)
    custom = pipe(texts, batch_size=4, custom_generate=hf_dspark.generate, drafter=drafter, **kw)
    assert plain == assisted == custom


@pytest.mark.real
def test_real_smollm2_stop_strings_cut_inside_block(smollm2, oracle):
    model, tok = smollm2
    drafter = make_tiny_drafter(model, mask_token_id=16, markov_rank=32)
    text = tok.apply_chat_template([{"role": "user", "content": "Count from one to twenty in words."}], tokenize=False, add_generation_prompt=True)
    enc = tok([text], return_tensors="pt")
    full = model.generate(**enc, max_new_tokens=40, do_sample=False)
    generated = tok.decode(full[0, enc["input_ids"].shape[1] :])
    stop = generated.split()[4]  # a word that appears a few tokens in
    ref = model.generate(**enc, max_new_tokens=40, do_sample=False, stop_strings=[stop], tokenizer=tok)
    oracle(full)
    out = model.generate(**enc, max_new_tokens=40, do_sample=False, stop_strings=[stop], tokenizer=tok, assistant_model=drafter)
    assert torch.equal(out, ref)
    assert tok.decode(out[0, enc["input_ids"].shape[1] :]).endswith(stop)
    assert drafter.last_stats.mean_accepted_length > 2.0


# ------------------------------------------------------------------------------------------------ stopping
def test_eos_inside_accepted_block_and_rows_finish_at_different_steps(tiny_target, tiny_drafter, oracle):
    enc = ragged_batch(256, seed=1)
    free = tiny_target.generate(**enc, max_new_tokens=30, do_sample=False, eos_token_id=None)
    eos = int(free[1, enc["input_ids"].shape[1] + 9])  # row 1 emits it 10 tokens in
    ref = tiny_target.generate(**enc, max_new_tokens=30, do_sample=False, eos_token_id=eos)
    oracle(free)
    out = tiny_target.generate(**enc, max_new_tokens=30, do_sample=False, eos_token_id=eos, assistant_model=tiny_drafter)
    assert torch.equal(out, ref)
    new = out[:, enc["input_ids"].shape[1] :]
    ended = [(row == eos).nonzero()[0].item() if (row == eos).any() else None for row in new]
    assert ended[1] is not None and ended[1] <= 9
    assert len(set(ended)) > 1  # rows stop at different steps


@pytest.mark.parametrize("max_new_tokens", [1, 2, 13])
def test_max_new_tokens_exact_for_every_row(tiny_target, tiny_drafter, oracle, max_new_tokens):
    enc = ragged_batch(256, seed=2)
    ref = tiny_target.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None)
    oracle(ref)
    out = tiny_target.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter)
    assert torch.equal(out, ref)
    assert out.shape[1] - enc["input_ids"].shape[1] == max_new_tokens
    assert tiny_drafter.last_stats.verified_tokens <= 4 * max(0, max_new_tokens - 1) * tiny_drafter.config.block_size


def test_streamer_receives_exactly_the_final_tokens(tiny_target, tiny_drafter, oracle):
    enc = ragged_batch(256, lengths=(7,), seed=4)
    free = tiny_target.generate(**enc, max_new_tokens=25, do_sample=False, eos_token_id=None)
    eos = int(free[0, 7 + 17])
    oracle(free)
    streamer = CollectStreamer()
    out = tiny_target.generate(**enc, max_new_tokens=25, do_sample=False, eos_token_id=eos, assistant_model=tiny_drafter, streamer=streamer)
    assert streamer.ended
    assert streamer.chunks[0] == enc["input_ids"][0].tolist()
    assert list(itertools.chain(*streamer.chunks[1:])) == out[0, 7:].tolist()
    assert any(len(c) > 1 for c in streamer.chunks[1:])  # whole accepted blocks arrive at once


# ------------------------------------------------------------------------------------------------ statistics
def test_statistics_reported(tiny_target, tiny_drafter, oracle):
    enc = ragged_batch(256, seed=5)
    ref = tiny_target.generate(**enc, max_new_tokens=20, do_sample=False, eos_token_id=None)
    oracle(ref)
    out = tiny_target.generate(
        **enc, max_new_tokens=20, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter, return_dict_in_generate=True
    )
    stats = out.dspark_stats
    assert stats is tiny_drafter.last_stats
    assert torch.equal(out.sequences, ref)
    assert stats.steps > 0 and 1.0 <= stats.mean_accepted_length <= 8.0
    assert len(stats.per_position_acceptance) == 7
    assert stats.verified_tokens >= stats.accepted_tokens > 0
    # every generated token is either an accepted draft or one bonus/correction token per (row, step), plus the prefill token
    assert stats.accepted_tokens + len(stats.accepted_lengths) + 4 == 4 * 20
    summary = stats.summary()
    for key in ("mean_accepted_length", "per_position_acceptance", "verified_tokens", "accepted_tokens", "steps"):
        assert key in summary


@pytest.mark.parametrize("verify", [dict(adaptive_verification=False), dict(draft_tree_size=9)], ids=["chain", "tree"])
def test_output_scores_and_logits_are_plain_decodings(tiny_target, tiny_drafter, oracle, verify):
    """return_dict_in_generate with output_scores / output_logits: per generated token the processed scores and the
    raw logits plain generate() returns (up to float rounding: they come from the wider verify forward); a row that
    ended early holds zeros past its end, where plain decoding goes on scoring padding."""
    enc = ragged_batch(256, seed=8)
    kw = dict(max_new_tokens=24, do_sample=False, repetition_penalty=1.3, no_repeat_ngram_size=3,
              return_dict_in_generate=True, output_scores=True, output_logits=True)
    probe = tiny_target.generate(**enc, **kw, eos_token_id=None).sequences
    eos = int(probe[0, enc["input_ids"].shape[1] + 5])  # row 0 ends early, at its sixth token
    ref = tiny_target.generate(**enc, **kw, eos_token_id=eos, pad_token_id=0)
    oracle(ref.sequences)
    out = tiny_target.generate(**enc, **kw, eos_token_id=eos, pad_token_id=0, assistant_model=tiny_drafter, **verify)
    assert torch.equal(out.sequences, ref.sequences)
    assert out.dspark_stats.mean_accepted_length > 2.0  # drafts were accepted: scores came from verify forwards
    assert len(out.scores) == len(out.logits) == len(ref.scores) == out.sequences.shape[1] - enc["input_ids"].shape[1]
    new = out.sequences[:, enc["input_ids"].shape[1]:]
    ended = (new == eos).int().cumsum(1).cumsum(1) > 1  # [N, G] positions after each row's EOS
    assert ended[0].any()
    for name in ("scores", "logits"):
        got, want = torch.stack(getattr(out, name), 1), torch.stack(getattr(ref, name), 1)  # [N, G, V]
        torch.testing.assert_close(got[~ended], want[~ended], atol=1e-4, rtol=1e-4)
        assert not got[ended].any()
    assert not torch.equal(out.scores[3], out.logits[3])  # scores: processed (the repetition penalty); logits: raw


@pytest.mark.parametrize("verify", [dict(adaptive_verification=False), dict()], ids=["chain", "default tree"])
def test_sampled_output_logits_are_the_targets_at_each_token(tiny_target, tiny_drafter, verify):
    enc = ragged_batch(256, seed=9)
    prompt = enc["input_ids"].shape[1]
    torch.manual_seed(0)
    out = tiny_target.generate(**enc, max_new_tokens=16, do_sample=True, top_k=50, eos_token_id=None, **verify,
                               assistant_model=tiny_drafter, return_dict_in_generate=True, output_scores=True,
                               output_logits=True)
    seq = out.sequences
    mask = torch.cat([enc["attention_mask"], torch.ones_like(seq[:, prompt:])], 1)
    full = tiny_target(input_ids=seq, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    torch.testing.assert_close(torch.stack(out.logits, 1), full[:, prompt - 1 : -1], atol=1e-4, rtol=1e-4)
    scores = torch.stack(out.scores, 1)  # [N, G, V]: top-k kept 50 of 256, the sampled token among them
    assert torch.equal(torch.isfinite(scores).sum(-1), torch.full(scores.shape[:2], 50))
    assert torch.isfinite(scores.gather(-1, seq[:, prompt:, None])).all()


def test_verify_forwards_keep_grouped_kv_heads_under_a_mask(tiny_target, tiny_drafter, oracle, monkeypatch):
    """transformers' SDPA attention gets enable_gqa for the masked verify forwards on a CPU (no repeated K/V heads);
    the output stays plain decoding's, and the variable is gone after the call."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, **kw):
        calls.append((q.shape[1], q.shape[2], attn_mask is not None, k.shape[1], kw.get("enable_gqa", False)))
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    enc = ragged_batch(256, seed=4)
    ref = tiny_target.generate(**enc, max_new_tokens=12, do_sample=False, eos_token_id=None)
    oracle(ref)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    out = tiny_target.generate(**enc, max_new_tokens=12, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter)
    assert torch.equal(out, ref)
    kv_heads = tiny_target.config.num_key_value_heads
    # the target's masked forwards of several tokens (one token's query is packed onto the K/V heads: [R, Hk, groups, D])
    heads = tiny_target.config.num_attention_heads
    masked_verify = [c for c in calls if c[0] == heads and c[1] > 1 and c[2] and c[3] in (kv_heads, heads)]
    assert masked_verify and all(c[3] == kv_heads and c[4] for c in masked_verify)
    assert SDPA_FORCE_GQA not in os.environ


def test_output_attentions_and_hidden_states_are_refused_by_name(tiny_target, tiny_drafter):
    enc = ragged_batch(256, lengths=(5,))
    for name in ("output_attentions", "output_hidden_states"):
        with pytest.raises(ValueError, match=f"{name}=True is not supported.*dspark_engine='transformers'"):
            tiny_target.generate(**enc, max_new_tokens=4, assistant_model=tiny_drafter, return_dict_in_generate=True,
                                 **{name: True})


def test_num_speculative_tokens_and_threshold_limit_verification(tiny_target, tiny_drafter):
    enc = ragged_batch(256, seed=6)
    ref = tiny_target.generate(**enc, max_new_tokens=12, do_sample=False, eos_token_id=None)
    out = tiny_target.generate(**enc, max_new_tokens=12, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter, num_speculative_tokens=2)
    assert torch.equal(out, ref)
    assert max(tiny_drafter.last_stats.verified_lengths) <= 2
    out = tiny_target.generate(**enc, max_new_tokens=12, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter, num_speculative_tokens=0)
    assert torch.equal(out, ref) and tiny_drafter.last_stats.drafted_steps == 0  # nothing to verify: no drafter pass
    out = tiny_target.generate(**enc, max_new_tokens=12, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter, confidence_threshold=0.999)
    assert torch.equal(out, ref)
    out = tiny_target.generate(**enc, max_new_tokens=12, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter, markov=False)
    assert torch.equal(out, ref)


# ------------------------------------------------------------------------------------------------ sampling exactness
V_SMALL, N_TOKENS, SAMPLES = 6, 3, 6000


def exact_joint(model, prompt: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """P(x1, x2, x3 | prompt) of plain sampling with the same warpers, over all V^3 continuations."""
    return _sampling.exact_joint(model, prompt, [TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k)], V_SMALL, N_TOKENS)


def sample_counts(model, prompt, samples: int = SAMPLES, **kw) -> torch.Tensor:
    torch.manual_seed(1234)
    ids = prompt.expand(samples, -1).contiguous()
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_TOKENS, do_sample=True, temperature=0.8, top_k=4, **kw)
    cells = (out[:, -N_TOKENS:] * torch.tensor([V_SMALL**2, V_SMALL, 1])).sum(1)
    return torch.bincount(cells, minlength=V_SMALL**N_TOKENS).float()


@pytest.fixture(scope="module")
def small_vocab():
    target = make_tiny_target(seed=7, vocab_size=V_SMALL, eos_token_id=None, pad_token_id=0, bos_token_id=None)
    drafter = make_tiny_drafter(target, seed=8, mask_token_id=V_SMALL - 1, markov_rank=4)
    prompt = torch.tensor([[1, 2, 3, 4]])
    return target, drafter, prompt, exact_joint(target, prompt, 0.8, 4)


TABLE = StepTimeTable([1, 2048, 8192, 16384], [100.0, 80.0, 30.0, 10.0], 65536, {})


def skipping_policy() -> AdaptiveVerification:
    """The scheduler on a device where drafting costs 20x a plain step: after the full-block warm-up it skips the
    drafter, probing every other step (no probe budget), so drafted and plain steps alternate inside one call."""
    costs = FixedStepCosts([1.0] + [20.0] * 8)
    return AdaptiveVerification(TABLE, probe_every=1, max_probe_every=1, costs=costs, probe_budget=math.inf)


def mid_depth_policy() -> AdaptiveVerification:
    """The scheduler where each drafted token costs as much as half a plain step: it drafts a few tokens deep (the
    per-step rule alone -- static_batch=False, no plain re-measuring -- so the depth follows the per-step arithmetic
    of the tests)."""
    costs = FixedStepCosts([1.0 + 0.5 * L for L in range(9)])
    return AdaptiveVerification(TABLE, costs=costs, static_batch=False, remeasure_margin=0)


@pytest.mark.parametrize("policy", ["full", "threshold", "adaptive", "adaptive_skip", "adaptive_mid_depth", "tree", "lookup", "tree_lookup", "copy", "tree_copy"])
def test_sampling_matches_target_distribution(small_vocab, policy):
    target, drafter, prompt, probs = small_vocab
    kw = {}
    if policy == "threshold":
        kw["confidence_threshold"] = 0.5
    elif policy == "adaptive":
        kw["verify_policy"] = AdaptiveVerification(TABLE)
    elif policy == "adaptive_skip":
        kw["verify_policy"] = skipping_policy()
    elif policy == "adaptive_mid_depth":
        kw["verify_policy"] = mid_depth_policy()
    elif policy == "tree":
        kw["draft_tree_size"] = 9
    elif policy == "lookup":  # a batch: the drafter's best chain, plus a prompt-lookup branch
        kw["prompt_lookup_num_tokens"] = 3
    elif policy == "tree_lookup":  # a tree of 9 nodes, a branch of up to 9 among them
        kw.update(draft_tree_size=9, prompt_lookup_num_tokens=9)
    elif policy == "copy":  # copy drafting in a chain on one-token matches: in 6 tokens most slots copy
        kw.update(copy_ngram=1, adaptive_verification=False)
    elif policy == "tree_copy":  # a tree of 9 with a copied child under every expanded node
        kw.update(draft_tree_size=9, prompt_lookup_num_tokens=0, copy_ngram=1)
    counts = sample_counts(target, prompt, assistant_model=drafter, **kw)
    assert _sampling.chi_square_pvalue(counts, probs) > 1e-3
    stats = drafter.last_stats
    assert stats.accepted_tokens > 0  # the verifier really accepted drafts
    if policy == "adaptive_skip":
        assert 0 < stats.drafted_steps < stats.steps


def test_sampling_test_catches_a_wrong_verifier(small_vocab, monkeypatch):
    target, drafter, prompt, probs = small_vocab
    real = G.rejection_sample

    def accept_everything(target_probs, draft_ids, draft_probs, cu, uniforms, noise, greedy):
        return real(target_probs, draft_ids, draft_probs, cu, torch.zeros_like(uniforms), noise, greedy)

    monkeypatch.setattr(G, "rejection_sample", accept_everything)
    # this drafter is close to the target, so accepting every draft skews the law only a little: at 6,000 samples
    # the p-value swung from 1e-6 to 4e-3 with the random stream; at 20,000 it is ~1e-33 (a right verifier: 0.93)
    counts = sample_counts(target, prompt, samples=20_000, assistant_model=drafter)
    assert _sampling.chi_square_pvalue(counts, probs) < 1e-6


def test_sampling_test_catches_a_wrong_tree_walk(small_vocab, monkeypatch):
    """A walk that always follows each node's most likely child (whatever the target drew) is not plain sampling."""
    target, drafter, prompt, probs = small_vocab
    real = G.accept_tree

    def follow_first_child(tree, choice, caps):
        first = [{} for _ in range(tree.tokens.shape[0])]  # per row: slot -> its first child's token
        for row, (parents, tokens) in enumerate(zip(tree.parents.tolist(), tree.tokens.tolist())):
            for p, t in zip(parents, tokens):
                first[row].setdefault(p, t)
        return real(tree, lambda row, slot: first[row].get(slot, choice(row, slot)), caps)

    monkeypatch.setattr(G, "accept_tree", follow_first_child)
    counts = sample_counts(target, prompt, assistant_model=drafter, draft_tree_size=9)
    assert _sampling.chi_square_pvalue(counts, probs) < 1e-6


def test_sampling_test_catches_copies_drafted_with_the_drafters_q(small_vocab, monkeypatch):
    """A copied token verified against the drafter's distribution instead of the one-hot it was drawn from."""
    target, drafter, prompt, probs = small_vocab

    def copy_keeping_q(copy, drafted, x, q):
        x, _ = real(copy, drafted, x, None)
        return x, q

    real = drafting._copy_drafts
    monkeypatch.setattr(drafting, "_copy_drafts", copy_keeping_q)
    counts = sample_counts(target, prompt, assistant_model=drafter, copy_ngram=1, adaptive_verification=False)
    assert _sampling.chi_square_pvalue(counts, probs) < 1e-6


def test_plain_sampling_passes_the_same_test(small_vocab):
    target, _, prompt, probs = small_vocab
    assert _sampling.chi_square_pvalue(sample_counts(target, prompt), probs) > 1e-3


def test_num_return_sequences_with_sampling(tiny_target, tiny_drafter):
    enc = ragged_batch(256, lengths=(4, 6))
    out = tiny_target.generate(**enc, max_new_tokens=5, do_sample=True, num_return_sequences=3, assistant_model=tiny_drafter)
    assert out.shape == (6, 6 + 5)


# ------------------------------------------------------------------------------------------------ bad input
def test_drafter_bound_to_another_target(tiny_target, tiny_drafter):
    other = make_tiny_target(seed=1)
    drafter = make_tiny_drafter(other)
    enc = ragged_batch(256, lengths=(4,))
    with pytest.raises(ValueError, match="bound to a different target"):
        tiny_target.generate(**enc, max_new_tokens=3, assistant_model=drafter)


def test_an_unbound_drafter_binds_through_custom_generate(tiny_target):
    """custom_generate=hf_dspark.generate binds an unbound drafter to the calling model, which routes
    assistant_model= from then on (hf_dspark.routing); tests/test_candidate_generator.py has the unbound-model error."""
    from hf_dspark import DSparkConfig, DSparkDrafter

    drafter = DSparkDrafter(DSparkConfig.from_target(tiny_target.config, mask_token_id=255, markov_rank=8))
    enc = ragged_batch(256, lengths=(4,))
    kw = dict(max_new_tokens=6, do_sample=False, eos_token_id=None)
    ref = tiny_target.generate(**enc, **kw)
    assert torch.equal(tiny_target.generate(**enc, **kw, custom_generate=hf_dspark.generate, drafter=drafter), ref)
    assert drafter.target is tiny_target
    assert torch.equal(tiny_target.generate(**enc, **kw, assistant_model=drafter), ref)


def test_vocab_mismatch_is_refused(tiny_target):
    drafter = make_tiny_drafter(make_tiny_target(vocab_size=300), mask_token_id=299)
    drafter._target = None
    with pytest.raises(ValueError, match="vocab_size"):
        tiny_target.generate(**ragged_batch(256, lengths=(4,)), max_new_tokens=3, custom_generate=hf_dspark.generate, drafter=drafter)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_beams=2), "beam search"),
        (dict(cache_implementation="static"), "dynamic cache"),
        (dict(num_speculative_tokens=9), "num_speculative_tokens"),
    ],
)
def test_unsupported_settings_are_refused(tiny_target, tiny_drafter, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_target.generate(**ragged_batch(256, lengths=(4,)), max_new_tokens=3, assistant_model=tiny_drafter, **kwargs)


def test_prompt_longer_than_context_is_refused(tiny_target, tiny_drafter):
    ids = torch.randint(3, 200, (1, 600))
    with pytest.raises(ValueError, match="context"):
        tiny_target.generate(input_ids=ids, max_new_tokens=3, assistant_model=tiny_drafter)


def test_empty_prompt_is_refused(tiny_target, tiny_drafter):
    ids = torch.zeros((1, 0), dtype=torch.long)
    with pytest.raises(ValueError):
        tiny_target.generate(input_ids=ids, max_new_tokens=3, custom_generate=hf_dspark.generate, drafter=tiny_drafter, bos_token_id=None)


def test_missing_drafter_is_refused(tiny_target):
    with pytest.raises(ValueError, match="drafter="):
        tiny_target.generate(**ragged_batch(256, lengths=(4,)), max_new_tokens=3, custom_generate=hf_dspark.generate)


def test_other_calls_are_untouched(tiny_target, tiny_drafter):
    """The route on a bound model only intercepts DSpark drafters: plain and prompt-lookup generation still run."""
    enc = ragged_batch(256, lengths=(6,))
    plain = tiny_target.generate(**enc, max_new_tokens=5, do_sample=False, eos_token_id=None)
    lookup = tiny_target.generate(**enc, max_new_tokens=5, do_sample=False, eos_token_id=None, prompt_lookup_num_tokens=3)
    assert torch.equal(plain, lookup)


@pytest.mark.real
def test_real_smollm2_shipped_drafter_is_exact(smollm2):
    """The trained drafter shipped in model_cards/ gives plain generate()'s output (fp32, greedy, batch 1 and 4)."""
    from hf_dspark import DSparkDrafter
    from hf_dspark.bench import default_drafter

    model, tok = smollm2
    drafter = DSparkDrafter.from_pretrained(default_drafter(), target=model)
    assert drafter.calibration is not None
    prompts = ["What is 7 + 5?", "Write a Python function that adds two numbers.", "Hello!", "List two fruits."]
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True) for p in prompts]
    for batch in (texts[:1], texts):
        enc = tok(batch, return_tensors="pt", padding=True)
        ref = model.generate(**enc, max_new_tokens=24, do_sample=False)
        assert torch.equal(model.generate(**enc, max_new_tokens=24, do_sample=False, assistant_model=drafter), ref)
        assert drafter.last_stats.steps > 0
