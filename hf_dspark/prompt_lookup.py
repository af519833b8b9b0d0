"""Prompt lookup as one more branch of the draft tree (`prompt_lookup_num_tokens=K`).

Outputs often repeat their context: a math answer restates the question's numbers and phrases, code re-types the
signature and names of its prompt. As transformers' prompt lookup does (`PromptLookupCandidateGenerator`), the last
n tokens of a row (n = `max_matching_ngram_size` down to 1) are searched for earlier in its prompt and output, and the
K tokens that followed the first match are proposed. They cost no model pass; `draft_tree.graft_branch` merges them
into the drafter's tree (sharing the nodes the drafter drafted too), so one target forward verifies both, and the
longest path the target agrees with wins. Which tokens are proposed depends on committed tokens only, so the output
stays plain decoding's, greedy or sampled.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEFAULT_NGRAM = 2  # transformers' default max_matching_ngram_size


@dataclass(frozen=True)
class PromptLookup:
    num_tokens: int  # K: the longest branch proposed
    max_ngram: int  # the longest suffix matched

    @classmethod
    def from_generation_config(cls, gen) -> "PromptLookup | None":
        """`prompt_lookup_num_tokens` / `max_matching_ngram_size` of a GenerationConfig -> a PromptLookup (None when
        prompt lookup is off); bad values are refused by name."""
        num = getattr(gen, "prompt_lookup_num_tokens", None)
        ngram = getattr(gen, "max_matching_ngram_size", None)
        if num is None:
            if ngram is not None:
                raise ValueError("max_matching_ngram_size only applies with prompt_lookup_num_tokens=K; set both or neither.")
            return None
        for name, value in (("prompt_lookup_num_tokens", num), ("max_matching_ngram_size", ngram)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int, got {value!r}.")
        return cls(num_tokens=num, max_ngram=DEFAULT_NGRAM if ngram is None else ngram)

    def propose(self, seq: torch.Tensor, limit: int) -> torch.Tensor:
        """seq [S] (prompt and committed tokens, the anchor last) -> the <= min(K, limit) tokens that followed the
        first earlier occurrence of its longest matching suffix ([0] when none matches)."""
        size = seq.shape[0]
        num = min(self.num_tokens, limit)
        for n in range(min(self.max_ngram, size - 1), 0, -1):
            windows = seq[: size - 1].unfold(0, n, 1)  # [S - n, n]: every n-gram followed by at least one token
            hits = (windows == seq[size - n :]).all(dim=1).nonzero()
            if hits.numel():
                start = int(hits[0]) + n
                return seq[start : start + num]
        return seq[:0]
