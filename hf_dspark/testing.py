"""Test helpers shared by the test suite and the GPU check script.

`oracle_drafts(reference)` makes the drafter propose the reference continuation with one corrupted token at a
random position (in a chain, or along the path to a random node of a draft tree). Greedy output must not depend on
what is drafted, so this exercises long accepted blocks, EOS and stop strings inside a block, per-row acceptance
differences, cache holes and compaction -- without a trained drafter.

`FixedStepCosts(seconds)` gives the scheduler step costs that do not learn from the (machine-dependent) timings,
so a test can put it in a chosen regime: skipping the drafter, drafting a middle depth, ...

`synthetic_drafts(reference, acceptance, seed)` proposes the reference continuation with every token independently
kept with probability `acceptance` (else corrupted) and sets the confidence logits to logit(acceptance): a drafter
of known, perfectly calibrated quality. Which positions are corrupted is drawn once per (seed, row, position), so
every contender run under the same seed meets the same luck whatever depths it drafts (common random numbers: a
paired comparison measures the policies, not two different draws), and different seeds give different draws. The
benchmark uses it to measure the scheduler and the loop for a drafter better than the shipped one; the real
drafter pass still runs, so drafting costs what it costs.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from . import drafting
from .drafting import Draft
from .step_costs import StepCosts
from .step_table import StepTimeTable


def ragged_batch(vocab: int, lengths=(5, 9, 3, 12), seed: int = 0, device: str | torch.device = "cpu") -> dict:
    """Left-padded random prompts of the given lengths: {"input_ids": [N, max_len], "attention_mask": [N, max_len]}."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, n in enumerate(lengths):
        ids[r, width - n :] = torch.randint(3, vocab - 1, (n,), generator=g)
        mask[r, width - n :] = 1
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


@contextmanager
def _edited_drafts(edit: Callable[..., Draft], name: str = "draft_block") -> Iterator[None]:
    """Run the real drafter pass, then replace its output by `edit(drafter, draft, prefix)`, until the block exits
    (in both engines: our loop and `DSparkCandidateGenerator` call `drafting.draft_block`; trees: `draft_tree`)."""
    real = getattr(drafting, name)

    def drafted(drafter, anchor, anchor_pos, ctx_kv, ctx_valid, processing, prefix, *args, **kwargs):
        out = real(drafter, anchor, anchor_pos, ctx_kv, ctx_valid, processing, prefix, *args, **kwargs)
        return edit(drafter, out, prefix)

    setattr(drafting, name, drafted)
    try:
        yield
    finally:
        setattr(drafting, name, real)


def _reference_continuation(reference: torch.Tensor, seq: torch.Tensor, length: int) -> torch.Tensor | None:
    """The next `length` (or fewer) tokens of the reference row that `seq` starts, or None if none does."""
    for ref in reference:
        if ref.shape[0] > seq.shape[0] and torch.equal(ref[: seq.shape[0]], seq):
            return ref[seq.shape[0] : seq.shape[0] + length]
    return None


@contextmanager
def oracle_drafts(reference: torch.Tensor, seed: int = 0) -> Iterator[None]:
    """reference [N, S]: full sequences (prompt + continuation) of plain greedy decoding. Chains and draft trees
    (`draft_tree_size`, or the tree a call of one prompt verifies by default) alike."""
    with _oracle_chain_drafts(reference, seed), oracle_tree_drafts(reference, seed):
        yield


def _oracle_chain_drafts(reference: torch.Tensor, seed: int):
    gen = torch.Generator().manual_seed(seed)

    def edit(drafter, out: Draft, prefix) -> Draft:
        tokens = out.tokens.clone()
        for i in range(tokens.shape[0]):
            cont = _reference_continuation(reference, prefix(i, tokens.new_zeros(0))[1], tokens.shape[1])
            if cont is not None:
                tokens[i, : cont.shape[0]] = cont
                k = int(torch.randint(0, tokens.shape[1] + 3, (1,), generator=gen))
                if k < tokens.shape[1]:
                    tokens[i, k] = (tokens[i, k] + 1) % drafter.config.vocab_size
        return Draft(tokens, out.q, out.conf_logits)

    return _edited_drafts(edit)


def oracle_tree_drafts(reference: torch.Tensor, seed: int = 0):
    """Like `oracle_drafts`, for draft trees: the path to a random node of each row's tree becomes the reference
    continuation, with one token corrupted now and then; the accepted path is then any of the tree's."""
    gen = torch.Generator().manual_seed(seed)

    def edit(drafter, out: Draft, prefix) -> Draft:
        tree = out.tree
        tokens = tree.tokens.clone()  # [n, N]
        for i in range(tokens.shape[0]):
            cont = _reference_continuation(reference, prefix(i, tokens.new_zeros(0))[1], drafter.config.block_size)
            if cont is None:
                continue
            node = int(torch.randint(0, tokens.shape[1], (1,), generator=gen))
            path = []
            while node >= 0:  # node j sits in verify slot j + 1; slot 0 is the anchor
                path.append(node)
                node = int(tree.parents[i, node]) - 1
            for j in path:
                level = int(tree.levels[i, j])
                if level < cont.shape[0]:
                    tokens[i, j] = cont[level]
            k = int(torch.randint(0, len(path) + 3, (1,), generator=gen))
            if k < len(path):
                tokens[i, path[k]] = (tokens[i, path[k]] + 1) % drafter.config.vocab_size
        tree = type(tree)(tokens=tokens, parents=tree.parents, levels=tree.levels)
        return Draft(tokens, None, None, tree=tree)

    return _edited_drafts(edit, "draft_tree")


def synthetic_drafts(reference: torch.Tensor, acceptance: float, seed: int = 0):
    """reference [N, S]: the batch's own greedy output (row r of the batch continues as reference[r]). A draft of
    position j of row r is wrong iff wrong[r, j], drawn once from `seed` with P = 1 - acceptance; positions past the
    reference keep the drafter's own token."""
    if not 0.0 < acceptance < 1.0:
        raise ValueError(f"acceptance must be in (0, 1), got {acceptance}.")
    gen = torch.Generator().manual_seed(seed)
    wrong_at = torch.rand(reference.shape, generator=gen) >= acceptance  # [N, S]
    logit = float(torch.logit(torch.tensor(acceptance, dtype=torch.float64)))

    def edit(drafter, out: Draft, prefix) -> Draft:
        tokens = out.tokens.clone()  # [n, B]
        n, b = tokens.shape
        wrong = torch.zeros((n, b), dtype=torch.bool)
        for i in range(n):
            row, seq = prefix(i, tokens.new_zeros(0))
            cont = reference[row, seq.shape[0] : seq.shape[0] + b].to(tokens.device)
            tokens[i, : cont.shape[0]] = cont
            wrong[i, : cont.shape[0]] = wrong_at[row, seq.shape[0] : seq.shape[0] + b]
        wrong = wrong.to(tokens.device)
        tokens[wrong] = (tokens[wrong] + 1) % drafter.config.vocab_size
        return Draft(tokens, out.q, torch.full((n, b), logit, device=tokens.device))

    return _edited_drafts(edit)


class FixedStepCosts(StepCosts):
    """Step costs that ignore measurements: `seconds(R, B)` is the given per-depth list [depth 0, 1, ..., B], or
    what a callable gives for R (a cost model that depends on the batch size). `age(L)` counts steps as usual."""

    def __init__(self, seconds: list[float] | Callable[[int], list[float]]):
        super().__init__(StepTimeTable([1, 2], [2.0, 1.0], max_batch_tokens=2))  # never consulted
        self.fixed = seconds if callable(seconds) else (lambda _, fixed=list(seconds): fixed)

    def seconds_list(self, num_requests: int, block_size: int) -> list[float]:
        fixed = [float(x) for x in self.fixed(num_requests)]
        if len(fixed) < block_size + 1:
            raise ValueError(f"FixedStepCosts has {len(fixed)} entries; the block needs {block_size + 1}.")
        return fixed[: block_size + 1]

    def observe(self, num_requests: int, depth: int, step_seconds: float, draft_seconds: float = 0.0) -> None:
        self._tick(depth, num_requests)  # the prices stay fixed; `age` still counts the steps
