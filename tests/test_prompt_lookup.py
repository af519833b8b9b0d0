"""Prompt lookup as a branch of the draft tree (`prompt_lookup_num_tokens`): the lookup itself, the graft onto the
tree, greedy exactness against plain decoding (ragged batches, chains and trees, branches longer than the block) and
the settings it refuses. Eager attention with logits processors: test_draft_tree; sampling: test_generation's
chi-square test."""

from __future__ import annotations

import math
import random

import pytest
import torch
from transformers import GenerationConfig

from hf_dspark.draft_tree import NO_NODE, DraftTree, accept_tree, graft_branch
from hf_dspark.prompt_lookup import CopyIndex, PromptLookup
from hf_dspark.testing import oracle_drafts, oracle_tree_drafts, ragged_batch


def test_lookup_proposes_what_follows_the_latest_match_of_the_longest_suffix():
    lookup = PromptLookup(num_tokens=3, max_ngram=2)
    propose = lambda seq, limit: lookup.propose(CopyIndex(seq, 1), limit, "cpu").tolist()  # noqa: E731
    seq = [7, 1, 2, 9, 9, 4, 1, 2, 5, 6, 7, 3, 1, 2]
    assert propose(seq, 10) == [5, 6, 7]  # "1 2" last seen at 6..7, then 5 6 7
    assert propose(seq, 2) == [5, 6]  # a row's cap cuts the branch
    # the match is renewed after each token: "2 9" then "9 9" (latest at 3..4, before the 4), then "9 4" ...
    renewed = PromptLookup(5, 2).propose(CopyIndex([2, 9, 9, 4, 8, 2, 9], 1), 5, "cpu")
    assert renewed.tolist() == [9, 4, 8, 2, 9]
    one = PromptLookup(3, 1)
    assert one.propose(CopyIndex([4, 8, 5, 8], 1), 5, "cpu").tolist() == [5, 8, 5]  # one-token matches: 8 -> 5 -> 8 -> 5
    assert propose([4, 8, 5, 8], 5) == []  # no fallback to one token (MIN_NGRAM)
    assert propose([1, 2, 3], 5) == [] and propose([3], 5) == []  # no earlier occurrence


def copied(seq: list[int], n: int, longest: int = 8, committed: int | None = None) -> int | None:
    """CopyIndex over seq's first `committed` tokens (all by default), asked with the rest as drafts."""
    committed = len(seq) if committed is None else committed
    return CopyIndex(seq[:committed], n).copied(seq[committed:], longest=longest)


def test_copy_takes_what_followed_the_latest_earlier_match_of_the_last_n_tokens():
    seq = [7, 1, 2, 9, 4, 1, 2, 5, 6, 1, 2]
    assert copied(seq, 2) == 5  # "1 2" at 1..2 (then 9) and at 5..6 (then 5): the latest
    assert copied(seq, 3) is None  # "6 1 2" did not occur before
    seq = [8, 1, 2, 3, 9, 0, 2, 3, 7, 1, 2, 3]
    assert copied(seq, 2, longest=2) == 7  # the latest "2 3"
    assert copied(seq, 2) == 9  # the longest match first: "1 2 3" at 1..3
    assert copied(seq, 2, committed=9) == 9  # the same with the last three tokens drafted
    assert copied([3, 3, 3], 2) == 3 and copied([3, 3, 3], 2, committed=1) == 3  # overlapping matches count
    assert copied([1, 2], 2) is None  # nothing before the suffix
    assert copied([5], 1) is None and copied([], 1) is None


def scanned_copy(seq: list[int], n: int, longest: int = 8) -> int | None:
    """The rule by brute force: over every earlier end of the suffix's longest match (up to `longest` tokens, at
    least n), the latest."""
    best, best_len = None, 0
    for end in range(n, len(seq)):  # seq[end] followed an occurrence ending at end - 1
        length = 0
        while length < min(longest, end) and seq[end - 1 - length] == seq[len(seq) - 1 - length]:
            length += 1
        if length >= n and length >= best_len:
            best, best_len = seq[end], length
    return best


def test_copy_index_matches_a_full_scan_as_the_row_grows():
    rng = random.Random(0)
    for _ in range(2000):
        seq = [rng.randrange(rng.choice((2, 3, 6))) for _ in range(rng.randrange(30))]
        n, prompt = rng.randint(1, 4), rng.randint(0, len(seq))
        generated = seq[prompt : rng.randint(prompt, len(seq))]
        index = CopyIndex(seq[:prompt], rng.randint(1, n))  # an index of shorter n-grams serves longer queries
        index.follow(generated[: len(generated) // 2])  # committed over two steps
        index.follow(generated)
        assert index.copied(seq[prompt + len(generated) :], n, longest=5) == scanned_copy(seq, n, longest=5), (seq, n)


@pytest.mark.parametrize("copy_ngram", [1, 3])
@pytest.mark.parametrize("drafts", ["chain", "tree"])
def test_greedy_identical_with_copy_drafting(tiny_target, tiny_drafter, copy_ngram, drafts):
    enc = ragged_batch(256)
    ref = tiny_target.generate(**enc, max_new_tokens=40, do_sample=False, eos_token_id=None)
    common = dict(max_new_tokens=40, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter)
    # a tree of 6 without its lookup branch: the copied children alone
    common |= dict(adaptive_verification=False) if drafts == "chain" else dict(draft_tree_size=6, prompt_lookup_num_tokens=0)
    assert torch.equal(tiny_target.generate(**enc, **common, copy_ngram=copy_ngram), ref)
    copying = tiny_drafter.last_stats.mean_accepted_length
    assert torch.equal(tiny_target.generate(**enc, **common, copy_ngram=0), ref)
    assert copying > tiny_drafter.last_stats.mean_accepted_length + 0.3  # the tiny target repeats itself
    oracle = oracle_drafts if drafts == "chain" else oracle_tree_drafts
    with oracle(ref):  # drafts edited into long right runs with a wrong token now and then
        assert torch.equal(tiny_target.generate(**enc, **common, copy_ngram=copy_ngram), ref)


def test_copy_drafting_is_on_for_chains_of_a_set_length_only(tiny_target, tiny_drafter, monkeypatch):
    """The full block copies by default; chains sized from calibrated confidences and trees do not, unless told."""
    import hf_dspark.generation as G

    calls = []
    real = G._copy_reader

    def recording(call, row_ids):
        reader = real(call, row_ids)
        if reader is not None:
            calls.append(call.copy_ngram)
        return reader

    monkeypatch.setattr(G, "_copy_reader", recording)
    enc = ragged_batch(256, lengths=(6, 9))
    for options, copies in ((dict(adaptive_verification=False), True), (dict(num_speculative_tokens=3), True),
                            (dict(confidence_threshold=0.5), False), (dict(draft_tree_size=4), False), (dict(), False),
                            (dict(copy_ngram=3), True), (dict(draft_tree_size=4, copy_ngram=2), True),
                            (dict(confidence_threshold=0.5, copy_ngram=2), True)):
        calls.clear()
        tiny_target.generate(**enc, max_new_tokens=8, do_sample=False, assistant_model=tiny_drafter, **options)
        assert bool(calls) == copies, options
        assert set(calls) <= {options.get("copy_ngram", 3)}


def test_lookup_settings_come_from_the_generation_config_and_bad_ones_are_refused():
    assert PromptLookup.from_generation_config(GenerationConfig()) is None
    assert PromptLookup.from_generation_config(GenerationConfig(prompt_lookup_num_tokens=5)) == PromptLookup(5, 2)
    assert PromptLookup.from_generation_config(GenerationConfig(prompt_lookup_num_tokens=5, max_matching_ngram_size=3)) == PromptLookup(5, 3)
    # a tree's branch (as long as the tree): on unless the call turns it off with 0
    assert PromptLookup.from_generation_config(GenerationConfig(), default_tokens=11) == PromptLookup(11, 2)
    assert PromptLookup.from_generation_config(GenerationConfig(prompt_lookup_num_tokens=0), default_tokens=11) is None
    for bad, message in ((dict(prompt_lookup_num_tokens=-1), "non-negative int"),
                         (dict(prompt_lookup_num_tokens=4, max_matching_ngram_size=0), "positive int")):
        with pytest.raises(ValueError, match=message):
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


def test_graft_within_a_budget_keeps_the_most_likely_nodes_of_the_tree_and_the_branch():
    # row 0: slots 1 (5) -> 2 (7), and 3 (6) -> 4 (9); row 1 is padded after one node
    log = lambda *p: [math.log(x) for x in p]  # noqa: E731
    tree = DraftTree(tokens=torch.tensor([[5, 7, 6, 9], [4, NO_NODE, NO_NODE, NO_NODE]]),
                     parents=torch.tensor([[0, 1, 0, 3], [0, 0, 0, 0]]), levels=torch.tensor([[0, 1, 0, 1], [0, 0, 0, 0]]),
                     scores=torch.tensor([log(0.9, 0.1, 0.05, 0.04), log(0.9, 1, 1, 1)]))
    # row 0's branch shares slot 3 (6) and adds 3, 8: scored 0.5, 0.25, 0.125 it outranks 7 (0.1) and 9 but not 5
    out = graft_branch(tree, [torch.tensor([6, 3, 8]), torch.tensor([2, 2])], size=4, token_logprob=math.log(0.5))
    assert out.tokens.tolist() == [[5, 6, 3, 8], [4, 2, 2, NO_NODE]]
    assert out.parents.tolist() == [[0, 0, 2, 3], [0, 0, 2, 0]]
    assert out.levels.tolist() == [[0, 0, 1, 2], [0, 0, 1, 0]]
    # a more likely branch displaces more of the tree, a less likely one less; no branch leaves the tree's best nodes
    certain = graft_branch(tree, [torch.tensor([1, 2, 3, 4, 5])] * 2, size=2)
    assert certain.tokens.tolist() == [[1, 2], [1, 2]]
    unlikely = graft_branch(tree, [torch.tensor([6, 3])] * 2, size=3, token_logprob=math.log(0.01))
    assert unlikely.tokens.tolist() == [[5, 7, 6], [4, 6, 3]]
    assert graft_branch(tree, [torch.tensor([], dtype=torch.long)] * 2, size=3).tokens.tolist() == [[5, 7, 6], [4, NO_NODE, NO_NODE]]


@pytest.mark.parametrize("kw", [dict(prompt_lookup_num_tokens=5), dict(prompt_lookup_num_tokens=12, draft_tree_size=6),
                                dict(prompt_lookup_num_tokens=3, max_matching_ngram_size=1, draft_tree_size=1)])
def test_greedy_identical_with_a_lookup_branch(tiny_target, tiny_drafter, kw):
    enc = ragged_batch(256)
    ref = tiny_target.generate(**enc, max_new_tokens=40, do_sample=False, eos_token_id=None)
    common = dict(max_new_tokens=40, do_sample=False, eos_token_id=None, assistant_model=tiny_drafter)
    out = tiny_target.generate(**enc, **common, **kw)
    assert torch.equal(out, ref)
    with_lookup = tiny_drafter.last_stats.mean_accepted_length
    tiny_target.generate(**enc, **common, draft_tree_size=kw.get("draft_tree_size", 1), prompt_lookup_num_tokens=0)
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
        (dict(prompt_lookup_num_tokens=-1), "non-negative int"),
        (dict(prompt_lookup_num_tokens=4, adaptive_verification=True), "adaptive_verification"),
        (dict(prompt_lookup_num_tokens=4, dspark_engine="transformers"), "our loop only"),
        (dict(copy_ngram=-1), "non-negative int"),
        (dict(copy_ngram=True), "non-negative int"),
        (dict(copy_ngram=2, dspark_engine="transformers"), "our loop only"),
    ],
)
def test_lookup_settings_that_cannot_be_honoured_are_refused(tiny_target, tiny_drafter, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_target.generate(**ragged_batch(256, lengths=(4,)), max_new_tokens=3, assistant_model=tiny_drafter, **kwargs)
