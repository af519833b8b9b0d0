"""Prompt lookup as a branch of the draft tree (`prompt_lookup_num_tokens`): the lookup itself, the graft onto the
tree, greedy exactness against plain decoding (ragged batches, chains and trees, branches longer than the block) and
the settings it refuses. Eager attention with logits processors: test_draft_tree; sampling: test_generation's
chi-square test."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from hf_dspark.draft_tree import NO_NODE, DraftTree, accept_tree, graft_branch
from hf_dspark.prompt_lookup import PromptLookup
from hf_dspark.testing import oracle_tree_drafts, ragged_batch


def test_lookup_proposes_what_followed_the_first_match_of_the_longest_suffix():
    lookup = PromptLookup(num_tokens=3, max_ngram=2)
    seq = torch.tensor([7, 1, 2, 9, 9, 4, 1, 2, 5, 6, 7, 3, 1, 2])
    assert lookup.propose(seq, limit=10).tolist() == [9, 9, 4]  # "1 2" first seen at 1..2, then 9 9 4
    assert lookup.propose(seq, limit=2).tolist() == [9, 9]  # a row's cap cuts the branch
    assert PromptLookup(3, 1).propose(torch.tensor([4, 8, 5, 8]), limit=5).tolist() == [5, 8]  # unigram, clipped at the end
    assert lookup.propose(torch.tensor([1, 2, 3]), limit=5).numel() == 0  # no earlier occurrence
    assert lookup.propose(torch.tensor([3]), limit=5).numel() == 0


def test_lookup_settings_come_from_the_generation_config_and_bad_ones_are_refused():
    assert PromptLookup.from_generation_config(GenerationConfig()) is None
    assert PromptLookup.from_generation_config(GenerationConfig(prompt_lookup_num_tokens=5)) == PromptLookup(5, 2)
    assert PromptLookup.from_generation_config(GenerationConfig(prompt_lookup_num_tokens=5, max_matching_ngram_size=3)) == PromptLookup(5, 3)
    for bad in (dict(prompt_lookup_num_tokens=0), dict(prompt_lookup_num_tokens=4, max_matching_ngram_size=-1)):
        with pytest.raises(ValueError, match="must be a positive int"):
            PromptLookup.from_generation_config(GenerationConfig(**bad))
    with pytest.raises(ValueError, match="only applies with prompt_lookup_num_tokens"):
        PromptLookup.from_generation_config(GenerationConfig(max_matching_ngram_size=3))


def test_graft_shares_agreeing_nodes_adds_the_rest_and_pads_narrow_rows():
    # row 0: slot 1 (token 5) -> slot 2 (token 7); row 1: slot 1 (token 6) -> slot 2 (token 8)
    tree = DraftTree(tokens=torch.tensor([[5, 7], [6, 8]]), parents=torch.tensor([[0, 1], [0, 1]]),
                     levels=torch.tensor([[0, 1], [0, 1]]))
    out = graft_branch(tree, [torch.tensor([5, 7, 3, 4]), torch.tensor([2])])
    assert out.tokens.tolist() == [[5, 7, 3, 4], [6, 8, 2, NO_NODE]]
    assert out.parents.tolist() == [[0, 1, 2, 3], [0, 1, 0, 0]]
    assert out.levels.tolist() == [[0, 1, 2, 3], [0, 1, 0, 0]]
    # the grafted path is accepted in full when the target agrees; a padding node never is
    choice = torch.tensor([[5, 7, 3, 4, 9], [NO_NODE + 1, 0, 0, 0, 0]])
    emitted, num_acc, _ = accept_tree(out, choice, torch.tensor([10, 10]))
    assert num_acc.tolist() == [4, 0] and emitted[0].tolist() == [5, 7, 3, 4, 9]


@pytest.mark.parametrize("kw", [dict(prompt_lookup_num_tokens=5), dict(prompt_lookup_num_tokens=12, draft_tree_size=6),
                                dict(prompt_lookup_num_tokens=3, max_matching_ngram_size=1, draft_tree_size=1)])
def test_greedy_identical_with_a_lookup_branch(tiny_target, tiny_drafter, kw):
    enc = ragged_batch(256)
    ref = tiny_target.generate(**enc, max_new_tokens=40, do_sample=False, eos_token_id=None)
    common = dict(max_new_tokens=40, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter)
    out = tiny_target.generate(**enc, **common, **kw)
    assert torch.equal(out, ref)
    with_lookup = tiny_drafter.last_stats.mean_accepted_length
    tiny_target.generate(**enc, **common, draft_tree_size=kw.get("draft_tree_size", 1))
    assert with_lookup > tiny_drafter.last_stats.mean_accepted_length + 0.3  # the tiny target repeats itself
    with oracle_tree_drafts(ref):
        assert torch.equal(tiny_target.generate(**enc, **common, **kw), ref)


def test_lookup_branch_longer_than_the_block_stops_exactly_at_max_new_tokens(tiny_target, tiny_drafter):
    enc = ragged_batch(256, lengths=(5, 9))
    for max_new in (1, 3, 17):
        ref = tiny_target.generate(**enc, max_new_tokens=max_new, do_sample=False, eos_token_id=None)
        out = tiny_target.generate(**enc, max_new_tokens=max_new, do_sample=False, eos_token_id=None,
                                   assistant_model=tiny_drafter, prompt_lookup_num_tokens=3 * tiny_drafter.config.block_size)
        assert torch.equal(out, ref), max_new


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompt_lookup_num_tokens=0), "positive int"),
        (dict(prompt_lookup_num_tokens=4, adaptive_verification=True), "adaptive_verification"),
        (dict(prompt_lookup_num_tokens=4, dspark_engine="transformers"), "our loop only"),
    ],
)
def test_lookup_settings_that_cannot_be_honoured_are_refused(tiny_target, tiny_drafter, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_target.generate(**ragged_batch(256, lengths=(4,)), max_new_tokens=3, assistant_model=tiny_drafter, **kwargs)
