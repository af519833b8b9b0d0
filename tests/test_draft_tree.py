"""Draft trees (`draft_tree_size`): the tree's invariants, greedy acceptance on hand-made trees, the cache reordering,
exactness against plain greedy decoding (random, oracle and real drafters; ragged batches; SDPA and eager attention;
logits processors) and the settings a tree cannot honour."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import make_tiny_drafter, make_tiny_target

from hf_dspark import drafting
from hf_dspark.draft_context import DraftContext
from hf_dspark.draft_tree import TREE_TOP_K, DraftTree, accept_tree, ancestor_mask, grow_tree
from hf_dspark.generation import DEFAULT_TREE_MAX_ROWS, default_tree_size
from hf_dspark.processing import Processing
from hf_dspark.scheduler import AdaptiveVerification, FullBlock
from hf_dspark.step_table import StepTimeTable
from hf_dspark.testing import oracle_tree_drafts, ragged_batch

# a hand-made tree over 2 levels, nodes best first: slot 1 (level 0, token 5) with children slot 3 (token 7) and
# slot 4 (token 8); slot 2 (level 0, token 6) with child slot 5 (token 9)
TREE = DraftTree(
    tokens=torch.tensor([[5, 6, 7, 8, 9]]),
    parents=torch.tensor([[0, 0, 1, 1, 2]]),
    levels=torch.tensor([[0, 0, 1, 1, 1]]),
)


def test_ancestor_mask_lets_each_node_see_the_anchor_and_its_ancestors_only():
    mask = ancestor_mask(TREE.parents)[0].int()
    assert mask.tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 0, 1, 0, 0, 1],
    ]


@pytest.mark.parametrize(
    "choice, cap, num_acc, emitted, path",
    [
        # the target picks 6 then 9: the second branch wins, its path moves first
        ([6, 0, 9, 0, 0, 0], 7, 2, [6, 9, 11], [0, 2, 5]),
        # the target picks 5 then 8: the first branch's second child
        ([5, 8, 0, 0, 0, 0], 7, 2, [5, 8, 11], [0, 1, 4]),
        # the target picks 5, then a token no child has: one draft and the target's own
        ([5, 3, 0, 0, 0, 0], 7, 1, [5, 3], [0, 1]),
        # nothing matches: the target's token after the anchor
        ([4, 0, 0, 0, 0, 0], 7, 0, [4], [0]),
        # a cap of one draft stops at level 0 although the path goes on
        ([6, 0, 9, 0, 0, 0], 1, 1, [6, 9], [0, 2]),
    ],
)
def test_accept_tree_takes_the_longest_agreeing_path(choice, cap, num_acc, emitted, path):
    choice = torch.tensor([choice])
    choice[0, 5] = 11  # the target's token after slot 5 (token 9) ...
    choice[0, 4] = 11  # ... and after slot 4 (token 8)
    out, acc, order = accept_tree(TREE, choice, torch.tensor([cap]))
    assert int(acc[0]) == num_acc
    assert out[0, : num_acc + 1].tolist() == emitted and (out[0, num_acc + 1 :] == -1).all()
    assert order[0, : num_acc + 1].tolist() == path
    assert sorted(order[0].tolist()) == list(range(6))  # a permutation of the verify slots


def test_accept_tree_prefers_the_most_likely_of_equally_long_paths():
    tree = DraftTree(tokens=torch.tensor([[5, 5]]), parents=torch.tensor([[0, 0]]), levels=torch.tensor([[0, 0]]))
    out, acc, order = accept_tree(tree, torch.tensor([[5, 1, 2]]), torch.tensor([7]))
    assert int(acc[0]) == 1 and order[0, :2].tolist() == [0, 1] and out[0, :2].tolist() == [5, 1]


@pytest.mark.parametrize("markov", [True, False])
def test_grown_tree_is_best_first_and_ancestor_closed(tiny_target, tiny_drafter, markov):
    torch.manual_seed(0)
    n, depth, size = 3, tiny_drafter.config.block_size, 12
    base = torch.randn(n, depth, tiny_drafter.draft_vocab_size) * 3
    hidden = torch.randn(n, depth, tiny_drafter.config.hidden_size)
    anchor = torch.tensor([3, 4, 5])
    tree = grow_tree(tiny_drafter, base, hidden, anchor, Processing(None, False, n), None, markov, size)
    assert tree.tokens.shape == tree.parents.shape == tree.levels.shape == (n, size)
    slots = torch.arange(1, size + 1)
    assert (tree.parents < slots).all()  # every parent comes before its child
    parent_level = torch.where(tree.parents > 0, tree.levels.gather(1, (tree.parents - 1).clamp(min=0)), -1)
    assert torch.equal(tree.levels, parent_level + 1)
    # the first node is the drafter's own first choice after the anchor
    first = base[:, 0].clone()
    if markov:
        latent, _ = tiny_drafter.markov_latent(anchor, hidden[:, 0])
        first = first + tiny_drafter.markov_bias(latent)
    assert torch.equal(tree.tokens[:, 0], first.argmax(-1)) and (tree.levels[:, 0] == 0).all()
    # no node appears twice (same parent, same token)
    for r in range(n):
        pairs = list(zip(tree.parents[r].tolist(), tree.tokens[r].tolist()))
        assert len(set(pairs)) == size


@pytest.mark.parametrize("scale", [0.3, 3.0, 30.0])  # flat drafts grow the whole depth, peaked ones stop early
def test_growth_stops_once_deeper_levels_cannot_enter_the_tree(tiny_drafter, monkeypatch, scale):
    from hf_dspark import draft_tree

    torch.manual_seed(0)
    n, depth = 4, tiny_drafter.config.block_size
    base = torch.randn(n, depth, tiny_drafter.draft_vocab_size) * scale
    hidden = torch.randn(n, depth, tiny_drafter.config.hidden_size)
    anchor = torch.tensor([3, 4, 5, 6])
    complete = draft_tree._tree_is_complete
    stops = []
    monkeypatch.setattr(draft_tree, "_tree_is_complete", lambda *a: stops.append(complete(*a)) or stops[-1])
    for size in (1, 4, 7, 12):
        args = (tiny_drafter, base, hidden, anchor, Processing(None, False, n), None, True, size)
        stopped = grow_tree(*args)
        with monkeypatch.context() as m:
            m.setattr(draft_tree, "_tree_is_complete", lambda *a: False)  # every level grown
            full = grow_tree(*args)
        for got, want in zip((stopped.tokens, stopped.parents, stopped.levels), (full.tokens, full.parents, full.levels)):
            assert torch.equal(got, want)
    assert any(stops)  # every scale stops early at least once (size 1 always does; peaked drafts for larger trees)


@pytest.mark.parametrize("project_first", [False, True])
@pytest.mark.parametrize("path_len", [4, 2])
def test_reorder_tail_moves_columns_with_their_positions(tiny_drafter, project_first, path_len):
    torch.manual_seed(0)
    m, h = len(tiny_drafter.tap_hidden_state_ids), tiny_drafter.config.hidden_size
    taps = torch.randn(2, 9, m * h)
    positions = torch.arange(9).expand(2, -1).clone()
    order = torch.tensor([[0, 3, 1, 2], [0, 2, 1, 3]])[:, :path_len]  # the accepted paths, into the last 4 columns
    ctx = DraftContext(tiny_drafter)
    ctx.append(taps, positions)
    if project_first:
        ctx.kv()
    ctx.reorder_tail(order, 4)
    keep = torch.cat([torch.arange(5).expand(2, -1), 5 + order], 1)  # the columns that must be right: 5 + path_len
    expected = DraftContext(tiny_drafter)
    expected.append(taps.gather(1, keep[:, :, None].expand(-1, -1, m * h)), positions.gather(1, keep))
    for (k, v), (ek, ev) in zip(ctx.kv(), expected.kv()):
        assert k.shape[2] == 9
        torch.testing.assert_close(k[:, :, : 5 + path_len], ek)
        torch.testing.assert_close(v[:, :, : 5 + path_len], ev)


@pytest.mark.parametrize("size", [1, 5, 16])
def test_greedy_identical_with_trees_tiny_ragged_batch(tiny_target, tiny_drafter, size):
    enc = ragged_batch(256)
    ref = tiny_target.generate(**enc, max_new_tokens=40, do_sample=False, eos_token_id=None)
    kw = dict(max_new_tokens=40, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter, draft_tree_size=size)
    assert torch.equal(tiny_target.generate(**enc, **kw), ref)  # the random drafter's own trees
    with oracle_tree_drafts(ref):
        assert torch.equal(tiny_target.generate(**enc, **kw), ref)
    if size > 1:
        assert tiny_drafter.last_stats.mean_accepted_length > 1.5  # a random drafter accepts ~nothing


@pytest.mark.parametrize("tree", [dict(draft_tree_size=9), dict(draft_tree_size=9, prompt_lookup_num_tokens=6)])
def test_trees_exact_with_eager_attention_and_prefix_processors(tree):
    target = make_tiny_target(attn_implementation="eager")
    drafter = make_tiny_drafter(target)
    enc = ragged_batch(256, lengths=(6, 11))
    kw = dict(max_new_tokens=24, do_sample=False, eos_token_id=None, repetition_penalty=1.3, no_repeat_ngram_size=3)
    ref = target.generate(**enc, **kw)
    with oracle_tree_drafts(ref, seed=1):
        assert torch.equal(target.generate(**enc, **kw, assistant_model=drafter, **tree), ref)
    assert drafter.last_stats.mean_accepted_length > 2.0


def test_trees_stop_exactly_at_max_new_tokens(tiny_target, tiny_drafter):
    enc = ragged_batch(256, lengths=(5, 9))
    for max_new in (1, 2, 9):
        ref = tiny_target.generate(**enc, max_new_tokens=max_new, do_sample=False, eos_token_id=None)
        with oracle_tree_drafts(ref):
            out = tiny_target.generate(**enc, max_new_tokens=max_new, do_sample=False, eos_token_id=None,
                                       assistant_model=tiny_drafter, draft_tree_size=12)
        assert torch.equal(out, ref), max_new


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(draft_tree_size=0), "draft_tree_size"),
        (dict(draft_tree_size=1000), "draft_tree_size"),
        (dict(draft_tree_size=True), "draft_tree_size"),
        (dict(draft_tree_size=7, adaptive_verification=True), "adaptive_verification"),
        (dict(draft_tree_size=7, confidence_threshold=0.5), "confidence_threshold"),
        (dict(draft_tree_size=7, dspark_engine="transformers"), "our loop only"),
    ],
)
def test_tree_settings_that_cannot_be_honoured_are_refused(tiny_target, tiny_drafter, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_target.generate(**ragged_batch(256, lengths=(4,)), max_new_tokens=3, assistant_model=tiny_drafter, **kwargs)


def test_tree_needs_an_attention_that_takes_a_4d_mask(tiny_target, tiny_drafter, monkeypatch):
    monkeypatch.setattr(type(tiny_target.config), "_attn_implementation", property(lambda self: "flash_attention_2"), raising=False)
    with pytest.raises(ValueError, match="attn_implementation='flash_attention_2'"):
        tiny_target.generate(**ragged_batch(256, lengths=(4,)), max_new_tokens=3, assistant_model=tiny_drafter, draft_tree_size=7)


@pytest.mark.parametrize(
    "lengths, kwargs, drafted_by",
    [
        ((6,), {}, "draft_tree"),  # one prompt, no verify option: a tree of block_size drafts
        ((6, 4), {}, "draft_tree"),  # a small batch: a tree per prompt
        ((6, 4, 5, 7, 3, 6, 4, 5, 8), {}, "draft_block"),  # more than DEFAULT_TREE_MAX_ROWS prompts: the chain (scheduler or full block)
        ((6,), dict(adaptive_verification=False), "draft_block"),
        ((6,), dict(num_speculative_tokens=3), "draft_block"),
        ((6,), dict(confidence_threshold=0.1), "draft_block"),
    ],
)
def test_a_call_of_few_prompts_without_a_verify_option_verifies_trees(tiny_target, tiny_drafter, monkeypatch, lengths, kwargs, drafted_by):
    calls = []
    for name in ("draft_block", "draft_tree"):
        real = getattr(drafting, name)
        monkeypatch.setattr(drafting, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    enc = ragged_batch(256, lengths=lengths)
    kw = dict(max_new_tokens=12, do_sample=False, eos_token_id=None)
    ref = tiny_target.generate(**enc, **kw)
    assert torch.equal(tiny_target.generate(**enc, **kw, assistant_model=tiny_drafter, **kwargs), ref)
    assert calls and set(calls) == {drafted_by}


def test_the_full_block_fallback_is_logged_only_where_the_chain_runs(tiny_target, tiny_drafter, caplog):
    """Without calibration the scheduler is off; one prompt or a small batch then verifies the default tree (no "full
    block" line), a larger batch verifies the full block and says why."""
    assert tiny_drafter.calibration is None
    kw = dict(max_new_tokens=4, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter)
    with caplog.at_level(logging.INFO, logger="hf_dspark.generation"):
        tiny_target.generate(**ragged_batch(256, lengths=(6,)), **kw)
        tiny_target.generate(**ragged_batch(256, lengths=(6, 4)), **kw)
        assert "verifying the full block" not in caplog.text
        assert tiny_drafter.last_stats.tree_size == tiny_drafter.config.block_size
        tiny_target.generate(**ragged_batch(256, lengths=(6, 4, 5, 7, 3, 6, 4, 5, 8)), **kw)
        assert "no calibration.json; verifying the full block" in caplog.text
        assert tiny_drafter.last_stats.tree_size is None


def test_default_tree_stays_off_where_a_wide_step_is_priced_high_or_the_attention_takes_no_tree(tiny_target, tiny_drafter, monkeypatch):
    b = tiny_drafter.config.block_size
    dear = AdaptiveVerification(StepTimeTable([1, b + 1], [10.0, 4.0], max_batch_tokens=64))  # 2.5 plain steps
    assert default_tree_size(tiny_target, tiny_drafter, dear) is None
    assert default_tree_size(tiny_target, tiny_drafter, FullBlock(None)) == b  # no step table: the full block's width
    monkeypatch.setattr(type(tiny_target.config), "_attn_implementation", property(lambda self: "flash_attention_2"), raising=False)
    assert default_tree_size(tiny_target, tiny_drafter, FullBlock(None)) is None


def test_default_tree_is_as_wide_as_the_devices_step_table_pays_for(tiny_target, tiny_drafter):
    """Where verifying 2 * (b + 1) tokens costs what b + 1 do, the default tree is wider than the block; where a
    step's price grows with its width as fast as tau(N) grows with N (TREE_TAU_GROWTH), it stays at the block's."""
    b = tiny_drafter.config.block_size
    most = b * TREE_TOP_K
    flat = AdaptiveVerification(StepTimeTable([1, b + 1, 2 * (b + 1), 4 * (b + 1)], [10.0, 8.0, 8.0, 4.0], max_batch_tokens=64))
    wide = default_tree_size(tiny_target, tiny_drafter, flat)
    assert b < wide <= min(most, 2 * b + 1)
    steep = AdaptiveVerification(StepTimeTable([1, b + 1, most + 1], [10.0, 8.0, 4.0], max_batch_tokens=64))
    assert default_tree_size(tiny_target, tiny_drafter, steep) == b
    # a batch: its rows' trees verify in one step of num_rows * (N + 1) tokens, priced by the table the same way
    assert default_tree_size(tiny_target, tiny_drafter, flat, num_rows=2) == b  # 2 (b + 1) tokens cost 1.25 plain steps
    assert default_tree_size(tiny_target, tiny_drafter, flat, num_rows=4) is None  # 4 (b + 1) tokens cost 2.5 plain steps
    assert default_tree_size(tiny_target, tiny_drafter, steep, num_rows=DEFAULT_TREE_MAX_ROWS + 1) is None  # chains
    assert default_tree_size(tiny_target, tiny_drafter, FullBlock(None), num_rows=DEFAULT_TREE_MAX_ROWS) == b
    short = AdaptiveVerification(StepTimeTable([1, b + 1], [10.0, 8.0], max_batch_tokens=64))  # prices no wider step
    assert default_tree_size(tiny_target, tiny_drafter, short) == b
    enc = ragged_batch(256, lengths=(6,))
    tiny_target.generate(**enc, max_new_tokens=4, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter)
    assert tiny_drafter.last_stats.tree_size == b  # no calibration, so no scheduler and no table: the block's width
    assert tiny_drafter.last_stats.lookup_tokens == b  # with a prompt-lookup branch among its nodes
    tiny_target.generate(**enc, max_new_tokens=4, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter,
                         prompt_lookup_num_tokens=0)
    assert (tiny_drafter.last_stats.tree_size, tiny_drafter.last_stats.lookup_tokens) == (b, None)  # 0: no branch
    tiny_target.generate(**enc, max_new_tokens=4, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter,
                         draft_tree_size=3)
    assert (tiny_drafter.last_stats.tree_size, tiny_drafter.last_stats.lookup_tokens) == (3, 3)  # as named


def test_real_smollm2_shipped_drafter_trees_are_exact_and_accept_more(smollm2):
    """fp32, greedy: a tree of 7 drafts gives plain generate()'s tokens (batch 1 and a padded batch of 3) and
    accepts more per step than the chain of 7 over these prompts."""
    from hf_dspark import DSparkDrafter
    from hf_dspark.bench import default_drafter

    model, tok = smollm2
    drafter = DSparkDrafter.from_pretrained(default_drafter(), target=model)
    prompts = ["What is 12 + 30? Think step by step.", "Write a Python function that reverses a list.", "Name three colors."]
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True) for p in prompts]
    tau = {}
    for batch in (texts[:1], texts):
        enc = tok(batch, return_tensors="pt", padding=True)
        ref = model.generate(**enc, max_new_tokens=32, do_sample=False)
        for size in (None, 7):
            out = model.generate(**enc, max_new_tokens=32, do_sample=False, assistant_model=drafter,
                                 adaptive_verification=False, draft_tree_size=size)
            assert torch.equal(out, ref), (len(batch), size)
            tau[len(batch), size] = drafter.last_stats.mean_accepted_length
    assert tau[3, 7] > tau[3, None]
