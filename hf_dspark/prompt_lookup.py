"""Prompt lookup as one more branch of the draft tree (on for every tree; `prompt_lookup_num_tokens=K` caps it, 0 turns
it off).

Outputs often repeat their context: a math answer restates the question's numbers and phrases, code re-types the
signature and names of its prompt. As transformers' prompt lookup does (`PromptLookupCandidateGenerator`), the last n
tokens of a row (n = `max_matching_ngram_size` down to 2, `MIN_NGRAM`) are searched for earlier in its prompt and
output, and the K tokens that followed the first match are proposed. They cost no model pass;
`draft_tree.graft_branch` merges them into the drafter's tree (sharing the nodes the drafter drafted too), where they
compete with the drafter's nodes for the tree's N places (priced by the row's running rate of accepted branch tokens,
`LookupRates`), so one target forward of the same width verifies both, and the longest path the target agrees with
wins. Which tokens are proposed and kept depends on committed tokens only, so the output stays plain decoding's,
greedy or sampled. A chain (no tree) gets a branch of K grafted on when K is set.

Copy drafting (`copy_ngram`, on by default in chains) copies inside the block instead: at each slot, where the last
tokens (the committed ones and the block's drafts so far) occurred earlier, the slot drafts the token that followed
their latest occurrence rather than the drafter's pick (`copied_token`), so a name or an identifier the drafter's
vocabulary lacks, or a phrase it does not foresee, is drafted as soon as the drafts before it reach it. The copied
token is drawn from a one-hot q, so verification stays exact when sampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DEFAULT_NGRAM = 2  # transformers' default max_matching_ngram_size
# the shortest suffix matched (unless max_matching_ngram_size is smaller): transformers falls back to one token, but a
# one-token match mostly proposes what the target does not write, and in a tree it costs the drafter places (a tree
# of 11: summed tau 10.89 against 10.79 with the fallback over GSM8K, HumanEval and MT-Bench, bench_results/s42)
MIN_NGRAM = 2
# When the branch competes for a tree's nodes, its token at level l scores (l + 1) * log p against the drafter's path
# log-probabilities, p the row's rate of accepted branch tokens so far, starting from PRIOR_RATE as if seen over
# PRIOR_TOKENS tokens (priors of 0.5 and 0.3 accepted less over GSM8K, HumanEval and MT-Bench, and a fixed rate of
# 0.7 or 0.85 a little less; code accepts more of its branches than chat does, bench_results/s42)
PRIOR_RATE = 0.7
PRIOR_TOKENS = 4.0


# copy drafting (`copy_ngram`): a chain's slot drafts the token that followed the latest earlier occurrence of the
# longest suffix of COPY_LONGEST_NGRAM down to `copy_ngram` tokens (committed or drafted) instead of the drafter's pick.
# Replayed on the target's greedy answers to 20 prompts per eval set, 3 and longest-first from 8 drafted more than 2, 3
# alone, the first occurrence, or a fallback for tokens outside the draft vocabulary (bench_results/s55/README.md)
DEFAULT_COPY_NGRAM = 3
COPY_LONGEST_NGRAM = 8


def check_copy_ngram(copy_ngram: int | None) -> None:
    """copy_ngram must be None (the default) or a non-negative int (0: off)."""
    if copy_ngram is not None and (isinstance(copy_ngram, bool) or not isinstance(copy_ngram, int) or copy_ngram < 0):
        raise ValueError(f"copy_ngram must be a non-negative int (0: no copy drafting), got {copy_ngram!r}.")


def copied_token(seq: torch.Tensor, n: int, longest: int = COPY_LONGEST_NGRAM) -> int | None:
    """seq [S] (prompt, committed tokens and the block's drafts so far) -> the token that followed the latest earlier
    occurrence of its longest suffix of `longest` down to `n` tokens, or None when none occurred before."""
    size = seq.shape[0]
    if size <= n:
        return None
    windows = seq[: size - 1].unfold(0, n, 1)  # [S - n, n]: every n-gram followed by at least one token
    ends = (windows == seq[size - n :]).all(dim=1).nonzero().flatten() + n  # [M] what followed each match
    best = ends[-1] if ends.numel() else None
    for m in range(n + 1, min(longest, size - 1) + 1):  # longer matches: the same ends, one more token before
        ends = ends[ends >= m]  # room for m tokens before the end
        ends = ends[seq[ends - m] == seq[size - m]]
        if not ends.numel():
            break
        best = ends[-1]
    return None if best is None else int(seq[best])


@dataclass(frozen=True)
class PromptLookup:
    num_tokens: int  # K: the longest branch proposed
    max_ngram: int  # the longest suffix matched

    @classmethod
    def from_generation_config(cls, gen, default_tokens: int | None = None) -> "PromptLookup | None":
        """`prompt_lookup_num_tokens` / `max_matching_ngram_size` of a GenerationConfig -> a PromptLookup (None when
        prompt lookup is off: 0, or unset without `default_tokens`, the branch a draft tree gets unless told 0); bad
        values are refused by name."""
        num = getattr(gen, "prompt_lookup_num_tokens", None)
        ngram = getattr(gen, "max_matching_ngram_size", None)
        for name, value, least in (("prompt_lookup_num_tokens", num, 0), ("max_matching_ngram_size", ngram, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                kind = "a non-negative int (0: no lookup branch)" if least == 0 else "a positive int"
                raise ValueError(f"{name} must be {kind}, got {value!r}.")
        if num is None:
            num = default_tokens
        if not num:
            if ngram is not None:
                raise ValueError("max_matching_ngram_size only applies with prompt_lookup_num_tokens=K; set both or neither.")
            return None
        return cls(num_tokens=num, max_ngram=DEFAULT_NGRAM if ngram is None else ngram)

    def propose(self, seq: torch.Tensor, limit: int) -> torch.Tensor:
        """seq [S] (prompt and committed tokens, the anchor last) -> the <= min(K, limit) tokens that followed the
        first earlier occurrence of its longest matching suffix ([0] when none matches)."""
        size = seq.shape[0]
        num = min(self.num_tokens, limit)
        for n in range(min(self.max_ngram, size - 1), min(MIN_NGRAM, self.max_ngram) - 1, -1):
            windows = seq[: size - 1].unfold(0, n, 1)  # [S - n, n]: every n-gram followed by at least one token
            hits = (windows == seq[size - n :]).all(dim=1).nonzero()
            if hits.numel():
                start = int(hits[0]) + n
                return seq[start : start + num]
        return seq[:0]


class LookupRates:
    """Per row, how often the target accepted the branch's tokens so far: each step's branch is accepted up to its
    first token the target did not take (a geometric count), and the rate prices the next branch's tokens. It reads
    committed tokens only, so the output stays plain decoding's."""

    def __init__(self, num_rows: int):
        self.accepted = [0.0] * num_rows  # per original row: branch tokens the target took
        self.rejected = [0.0] * num_rows  # per original row: branch tokens it did not (at most one per step)

    def token_logprob(self, row: int) -> float:
        """log of the rate at which row's branch tokens are accepted (the prior's at the start)."""
        taken = self.accepted[row] + PRIOR_RATE * PRIOR_TOKENS
        return math.log(taken / (self.accepted[row] + self.rejected[row] + PRIOR_TOKENS))

    def observe(self, row_ids: list[int], branches: list[torch.Tensor], emitted: torch.Tensor) -> None:
        """branches[i] [k_i] the branch running row i proposed, emitted [R, W] its step's tokens (-1: none): the
        branch's tokens up to the first that differs from what the target emitted count as accepted, that one as
        rejected."""
        for row, branch, out in zip(row_ids, branches, emitted.tolist()):
            agree = 0
            for proposed, taken in zip(branch.tolist(), out):
                if taken < 0 or proposed != taken:
                    break
                agree += 1
            self.accepted[row] += agree
            self.rejected[row] += agree < len(branch) and agree < len(out) and out[agree] >= 0
