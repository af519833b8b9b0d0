"""Prompt lookup as one more branch of the draft tree (on for every tree; `prompt_lookup_num_tokens=K` caps it, 0 turns
it off).

Outputs often repeat their context: a math answer restates the question's numbers and phrases, code re-types the
signature and names of its prompt. As transformers' prompt lookup does (`PromptLookupCandidateGenerator`), the last
tokens of a row are searched for earlier in its prompt and output, and the K tokens that follow are proposed; here
the match is the latest earlier occurrence of the longest suffix of up to 8 tokens (COPY_LONGEST_NGRAM, or
`max_matching_ngram_size` when larger) down to 2 (`MIN_NGRAM`), renewed after each proposed token (the copy rule
below, `CopyIndex.continuation`). They cost no model pass;
`draft_tree.graft_branch` merges them into the drafter's tree (sharing the nodes the drafter drafted too), where they
compete with the drafter's nodes for the tree's N places (priced by the row's running rate of accepted branch tokens,
`LookupRates`), so one target forward of the same width verifies both, and the longest path the target agrees with
wins. Which tokens are proposed and kept depends on committed tokens only, so the output stays plain decoding's,
greedy or sampled. A chain (no tree) gets a branch of K grafted on when K is set.

Copy drafting (`copy_ngram`, on by default in chains of a set length) copies inside the block as well:
where the last tokens (the committed ones and the drafts so far) occurred earlier, the token that followed their
latest occurrence is drafted next (`CopyIndex`), so a name or an identifier the drafter's vocabulary lacks, or a
phrase it does not foresee, is drafted as soon as the drafts before it reach it. A chain's slot drafts it instead of
the drafter's pick, from a one-hot q, so verification stays exact when sampling; a tree (when `copy_ngram` is set)
adds it as one more child of each expanded node (`draft_tree.grow_tree`), which the tree walk verifies like any other.
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


# copy drafting (`copy_ngram`): the token that followed the latest earlier occurrence of the longest suffix of
# COPY_LONGEST_NGRAM down to `copy_ngram` tokens (committed or drafted) is drafted next.
# Replayed on the target's greedy answers to 20 prompts per eval set, 3 and longest-first from 8 drafted more than 2, 3
# alone, the first occurrence, or a fallback for tokens outside the draft vocabulary (bench_results/s55/README.md).
# The tree's lookup branch follows the same rule from 2 tokens up: against transformers' rule (the K tokens after the
# first occurrence of the last 2), the shipped drafter's tree of 15 verified 11.925 against 11.625 summed tau over
# GSM8K, HumanEval and MT-Bench, each set's paired interval above zero (bench_results/s56)
DEFAULT_COPY_NGRAM = 3
COPY_LONGEST_NGRAM = 8
# a copied child in a tree scores its parent's path log-probability plus log(TREE_COPY_RATE). Summed tree-of-15 tau
# 12.144 / 12.180 / 12.280 at 0.6 / 0.7 / 0.8, within the eval's resolution of each other (bench_results/s56)
TREE_COPY_RATE = 0.8


def check_copy_ngram(copy_ngram: int | None) -> None:
    """copy_ngram must be None (the default) or a non-negative int (0: off)."""
    if copy_ngram is not None and (isinstance(copy_ngram, bool) or not isinstance(copy_ngram, int) or copy_ngram < 0):
        raise ValueError(f"copy_ngram must be a non-negative int (0: no copy drafting), got {copy_ngram!r}.")


class CopyIndex:
    """Copy drafting's and prompt lookup's memory of one row: where each n-gram of its committed tokens (prompt and
    output) occurred, kept as the row grows, so that a query reads the occurrences of one suffix instead of rescanning
    the row (a tree asks once per expanded node and level, ~25 times a step). `n` is the shortest suffix any query
    matches."""

    def __init__(self, tokens: list[int], n: int):
        self.n = n
        self.tokens: list[int] = []  # the committed tokens indexed so far
        self.num_prompt = len(tokens)
        self.ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> positions of the tokens that followed it
        self._append(tokens)

    def follow(self, generated: list[int]) -> None:
        """Index the row's newly committed tokens (`generated`: all it has emitted so far)."""
        self._append(generated[len(self.tokens) - self.num_prompt :])

    def _append(self, tokens: list[int]) -> None:
        n = self.n
        for token in tokens:
            end = len(self.tokens)  # the new token's position: it follows the n-gram ending just before it
            self.tokens.append(token)
            if end >= n:
                self.ends.setdefault(tuple(self.tokens[end - n : end]), []).append(end)

    def copied(self, drafts: list[int], shortest: int | None = None, longest: int = COPY_LONGEST_NGRAM) -> int | None:
        """The token that followed the latest earlier occurrence of the longest suffix of `longest` down to `shortest`
        (>= n; default n) tokens of the committed tokens and then `drafts`, or None when none occurred before."""
        n, committed = self.n, len(self.tokens)
        shortest = n if shortest is None else shortest
        seq = self.tokens + drafts if drafts else self.tokens
        size = len(seq)
        if size <= n:
            return None
        suffix = seq[size - n :]
        # the occurrences followed by a committed token, then those that reach into the drafts (a few positions)
        ends = list(self.ends.get(tuple(suffix), ()))
        ends += [e for e in range(max(n, committed), size) if seq[e - n : e] == suffix]
        best = ends[-1] if ends and shortest <= n else None
        for m in range(n + 1, min(longest, size - 1) + 1):  # longer matches: the same ends, one more token before
            ends = [e for e in ends if e >= m and seq[e - m] == seq[size - m]]
            if not ends:
                break
            if m >= shortest:
                best = ends[-1]
        return None if best is None else seq[best]

    def continuation(self, limit: int, shortest: int | None = None, longest: int = COPY_LONGEST_NGRAM) -> list[int]:
        """Up to `limit` tokens, each the one `copied` names after the committed tokens and those before it."""
        tokens: list[int] = []
        while len(tokens) < limit and (token := self.copied(tokens, shortest, longest)) is not None:
            tokens.append(token)
        return tokens


@dataclass(frozen=True)
class PromptLookup:
    num_tokens: int  # K: the longest branch proposed
    max_ngram: int  # max_matching_ngram_size: the longest suffix matched, at least COPY_LONGEST_NGRAM (1: one-token matches too)

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

    @property
    def shortest(self) -> int:
        """The shortest suffix the branch matches."""
        return min(MIN_NGRAM, self.max_ngram)

    @property
    def longest(self) -> int:
        """The longest suffix the branch matches first."""
        return max(COPY_LONGEST_NGRAM, self.max_ngram)

    def propose(self, index: CopyIndex, limit: int, device: torch.device) -> torch.Tensor:
        """A row's index (of its prompt and committed tokens) -> the branch [<= min(K, limit)]: the tokens that follow
        its latest earlier match, renewed token by token (`CopyIndex.continuation`)."""
        branch = index.continuation(min(self.num_tokens, limit), self.shortest, self.longest)
        return torch.tensor(branch, dtype=torch.long, device=device)


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
