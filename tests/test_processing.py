"""Prefix-reading logits processors on several prefixes at once score as plain decoding's one call per row would."""

import pytest
import torch
from transformers.generation.logits_process import (
    ExponentialDecayLengthPenalty,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    TopKLogitsWarper,
)

from hf_dspark.processing import Processing

V, N = 64, 3  # vocabulary, the call's batch


class _RowAware(RepetitionPenaltyLogitsProcessor):
    """A subclass may read the row it is called for: it keeps plain decoding's call per row."""

    def __call__(self, input_ids, scores):
        return super().__call__(input_ids, scores) + torch.arange(scores.shape[0])[:, None]


PROCESSORS = {
    "min_length": lambda: MinLengthLogitsProcessor(14, eos_token_id=[2, 5]),
    "min_new_tokens": lambda: MinNewTokensLengthLogitsProcessor(8, 5, eos_token_id=2),
    "min_new_tokens, an EOS id outside the vocabulary": lambda: MinNewTokensLengthLogitsProcessor(
        8, 5, eos_token_id=[3, V + 1]),
    "repetition_penalty": lambda: RepetitionPenaltyLogitsProcessor(1.3),
    "repetition_penalty, prompt ignored": lambda: RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=8),
    "repetition_penalty, all ignored in some rows": lambda: RepetitionPenaltyLogitsProcessor(
        0.8, prompt_ignore_length=11),
    "repetition_penalty, per-row prompt ignored": lambda: RepetitionPenaltyLogitsProcessor(
        1.3, prompt_ignore_length=torch.tensor([8, 5, 10])),
    "no_repeat_ngram": lambda: NoRepeatNGramLogitsProcessor(2),
    "exponential_decay": lambda: ExponentialDecayLengthPenalty((2, 1.5), eos_token_id=2, input_ids_seq_length=8),
    "suppress_at_begin": lambda: SuppressTokensAtBeginLogitsProcessor([2, 7], begin_index=11),
    "subclass": lambda: _RowAware(1.3),
}


@pytest.mark.parametrize("name", list(PROCESSORS))
def test_prefix_processors_score_each_row_as_a_call_of_its_own(name):
    gen = torch.Generator().manual_seed(0)
    lengths = [9, 11, 11, 9, 14, 10, 11, 12]  # several rows per length, as a tree's nodes at one depth
    prefixes = [(i % N, torch.randint(0, 12, (n,), generator=gen)) for i, n in enumerate(lengths)]  # few ids: repeats
    prefixes[1][1][-2] = prefixes[4][1][3] = V + 1  # ids past the scores' vocabulary (a larger embedding) are ignored
    scores = torch.randn(len(lengths), V, generator=gen)
    procs = [TopKLogitsWarper(40), PROCESSORS[name](), PROCESSORS["no_repeat_ngram"]()]
    processing = Processing(procs, do_sample=False, batch_size=N)
    got = processing(scores.clone(), lambda i: prefixes[i])
    want = scores.clone()
    for proc in procs:  # plain decoding's call, one row at a time: a full batch of that row's prefix
        want = torch.stack([proc(ids[None].expand(N, -1), want[i][None].expand(N, -1).clone())[row]
                            for i, (row, ids) in enumerate(prefixes)])
    assert torch.equal(got, want)
    assert not torch.equal(got, TopKLogitsWarper(40)(None, scores))  # the processor changed something here
