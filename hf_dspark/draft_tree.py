"""Draft trees: verify the drafter's most likely continuations, not only its single best chain.

A DSpark drafter's backbone drafts every slot of the block in one pass from `[anchor, MASK x (B-1)]`, so its hidden
state h_k and logits U_k at slot k do not depend on the tokens drafted before k; only the Markov head's bias does
(l_k = U_k + bias(x_{k-1})). Other continuations of the block therefore cost no backbone pass: a child of a node is
one Markov bias away. The tree grows level by level, best first (as EAGLE-2): at level k the `top_k` most likely
nodes of level k-1 (by the product of the draft probabilities along their path, after the same logits processors
as the target's) each propose their `top_k` most likely next tokens; the `size` most likely nodes of all levels are
verified in one target forward, each attending to the context, the anchor and its own ancestors (a tree attention
mask).

Acceptance walks the tree from the anchor with the target's own token at each node: its greedy choice, or, when
sampling, one draw from its processed distribution at that node. While that token is one of the node's children
the walk moves to it; the first token that is not becomes the step's last (bonus) token. Every emitted token is
therefore what plain decoding would emit after the same prefix -- the same tokens when greedy, the same distribution
when sampling (the draws at nodes the walk never reaches are simply unused). The children are the drafter's top
choices, not draws from it, so a node accepts with the target's probability of its children; that is the best any
exact verifier can do for a fixed set of candidates.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch

from .modeling import DSparkDrafter
from .processing import Processing

TREE_TOP_K = 4  # nodes expanded per level, and children proposed per expanded node
NO_NODE = -1  # the token of a padding node (rows whose trees are narrower than the widest): never accepted


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [R, N] drafted target ids, best first (a node's parent comes before it); NO_NODE: padding
    parents: torch.Tensor  # [R, N] verify slot of each node's parent: 0 = the anchor, j + 1 = node j
    levels: torch.Tensor  # [R, N] the draft position of each node (0: the token after the anchor)
    scores: torch.Tensor | None = None  # [R, N] log-probability of each node's path under the drafter (-inf: padding)


def check_draft_tree_size(size: int | None, block_size: int) -> None:
    """draft_tree_size must be None or a positive int; more nodes than `block_size * TREE_TOP_K` cannot be grown."""
    if size is None:
        return
    most = block_size * TREE_TOP_K
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= most:
        raise ValueError(
            f"draft_tree_size={size!r} must be an int in [1, {most}] (block_size={block_size} levels of at most "
            f"{TREE_TOP_K} expanded nodes x {TREE_TOP_K} children); None drafts a single chain."
        )


def grow_tree(
    drafter: DSparkDrafter,
    base: torch.Tensor,  # [R, L, D] parallel-drafter logits U_k of the first L draft positions
    hidden: torch.Tensor,  # [R, L, H] their hidden states
    anchor: torch.Tensor,  # [R] the last committed token
    processing: Processing,
    prefix: Callable[[int, torch.Tensor], tuple[int, torch.Tensor]] | None,  # (row, drafts [k]) -> input_ids prefix
    markov: bool,
    size: int,
    state: torch.Tensor | None = None,  # [R, r] an rnn Markov head's state before the first draft (None: zeros)
    top_k: int = TREE_TOP_K,
    copy: Callable[[int, list[int]], int | None] | None = None,  # (row, path of k tokens) -> a token to propose after it
    copy_logprob: float = 0.0,
) -> DraftTree:
    """The `size` most likely nodes of a best-first tree over L levels (fewer when L * top_k^2 allows fewer).

    With `copy` (copy drafting), every expanded node also gets the child `copy(row, its path)` names (none where it
    names None), scored as its path's log-probability plus `copy_logprob`; where the drafter proposed that token too,
    the one child keeps the larger score."""
    n, depth, _ = base.shape
    device = base.device
    # the frontier: F nodes per row, each with its token, path score, node index and path of tokens
    front_tok = anchor[:, None]  # [R, F]
    front_score = torch.zeros((n, 1), device=device)  # [R, F] log-probability of the path
    front_node = torch.full((n, 1), -1, dtype=torch.long, device=device)  # [R, F] (-1: the anchor)
    track_paths = processing.reads_prefix or copy is not None  # what reads each node's path
    front_path = anchor.new_zeros((n, 1, 0))  # [R, F, k] the drafts on the path to each frontier node
    front_state = None if state is None else state[:, None]  # [R, F, r]
    toks, scores, parents, levels = [], [], [], []  # per level [R, F * top_k]
    draft_ids = drafter.draft_target_ids()  # [D] target id of each draft id (None: D = V)
    count = 0
    for k in range(depth):
        f = front_tok.shape[1]
        logits = base[:, k, None].float()  # [R, 1, D]
        to_target = draft_ids  # without prefix-reading processors the tree grows in the draft vocabulary
        new_state = None
        if markov:  # the head over the frontier as it stands: tokens [R, F], hidden states [R, F, H], state [R, F, r]
            latent, new_state = drafter.markov_latent(front_tok, hidden[:, k, None].expand(n, f, -1), front_state)
            if latent is not None:
                logits = logits + drafter.markov_bias(latent).float()  # [R, F, D]
        logits = logits.expand(n, f, -1).reshape(n * f, -1)  # [R*F, D] (no copy once the bias made it [R, F, D])
        if processing.reads_prefix:  # the target's processors score target ids [R*F, V], with each node's prefix
            paths = front_path.reshape(n * f, k)
            row_prefix = (lambda i: prefix(i // f, paths[i])) if prefix is not None else None
            logits, to_target = processing(drafter.to_target_vocab(logits), row_prefix), None
        else:  # warpers only read scores (temperature, top-k/p, ...): the draft vocabulary's are enough
            logits = processing(logits)
        top = torch.log_softmax(logits, dim=-1).topk(top_k, dim=-1)  # [R*F, top_k]
        child_score = front_score[:, :, None] + top.values.view(n, f, top_k)  # [R, F, K]
        child_tok = (top.indices if to_target is None else to_target[top.indices]).view(n, f, top_k)  # [R, F, K]
        if copy is not None:  # one more child per node: [R, F, K + 1]
            child_tok, child_score = _with_copies(copy, front_path, front_score, child_tok, child_score, copy_logprob)
        width = child_tok.shape[2]  # children per frontier node
        child_tok, child_score = child_tok.reshape(n, f * width), child_score.reshape(n, f * width)
        child_parent = front_node[:, :, None].expand(n, f, width).reshape(n, f * width)
        toks.append(child_tok)
        scores.append(child_score)
        parents.append(child_parent)
        levels.append(torch.full_like(child_tok, k))
        # the next frontier: this level's top_k children by path score
        keep = child_score.topk(min(top_k, f * width), dim=-1).indices  # [R, F']
        owner = keep // width  # the frontier node each kept child came from
        front_tok = child_tok.gather(1, keep)
        if copy is not None:  # a padding child (only when fewer than top_k score above -inf) stands in as its parent's best
            front_tok = torch.where(front_tok < 0, child_tok.view(n, f, width)[:, :, 0].gather(1, owner), front_tok)
        front_score = child_score.gather(1, keep)
        front_node = count + keep
        if track_paths:
            front_path = torch.cat([front_path.gather(1, owner[:, :, None].expand(-1, -1, k)), front_tok[:, :, None]], 2)
        if new_state is not None:
            new_state = new_state.view(n, f, -1)
            front_state = new_state.gather(1, owner[:, :, None].expand(-1, -1, new_state.shape[-1]))
        count += f * width
        if k + 1 < depth and count >= size and _tree_is_complete(scores, front_score, size):
            break
    return _best_nodes(torch.cat(toks, 1), torch.cat(scores, 1), torch.cat(parents, 1), torch.cat(levels, 1), size)


def _with_copies(copy, paths, front_score, child_tok, child_score, logprob: float):
    """paths [R, F, k] (the drafts leading to each frontier node), front_score [R, F], child_tok / child_score
    [R, F, K] the drafter's children -> [R, F, K + 1]: each node's copied token (`copy(row, path)`) as one more child
    scoring front_score + logprob; where the drafter proposed it too that child takes the larger score, and the extra
    child is padding (NO_NODE, -inf), as it is where copy names nothing. On Python lists: a few dozen values, and the
    tensor version's dozen small ops cost ~3x as much (~0.1 ms a level at batch 1 on a 2-core CPU)."""
    toks, scores = child_tok.tolist(), child_score.tolist()
    for r, (row_paths, row_front) in enumerate(zip(paths.tolist(), front_score.tolist())):
        for j, (path, parent_score) in enumerate(zip(row_paths, row_front)):
            token, score = copy(r, path), parent_score + logprob
            if token in toks[r][j]:  # the drafter proposed it too: one child, the larger score
                k = toks[r][j].index(token)
                scores[r][j][k] = max(scores[r][j][k], score)
                token = None
            toks[r][j].append(NO_NODE if token is None else token)
            scores[r][j].append(-math.inf if token is None else score)
    device = child_tok.device
    return torch.tensor(toks, device=device), torch.tensor(scores, dtype=child_score.dtype, device=device)


def _tree_is_complete(scores: list[torch.Tensor], front_score: torch.Tensor, size: int) -> bool:
    """Whether no deeper level can change the `size` best nodes: a descendant scores at most its frontier ancestor,
    and a deeper node that ties one of the best sorts after it, so once every row's best frontier score is at most
    its `size`-th best score so far, growing further only adds nodes `_best_nodes` drops (`scores`: per level
    [R, M_k], at least `size` nodes in all; front_score [R, F])."""
    kth = torch.cat(scores, 1).topk(size, dim=1).values[:, -1]  # [R] the size-th best score of each row
    return bool((front_score.max(dim=1).values <= kth).all())


def _best_nodes(tokens, scores, parents, levels, size: int) -> DraftTree:
    """Keep each row's `size` best nodes (all [R, M]), best first; a parent scores at least its child and sorts
    before it on ties (lower level first), so the kept set holds every kept node's ancestors."""
    size = min(size, tokens.shape[1])
    by_level = torch.sort(levels, dim=1, stable=True).indices
    order = by_level.gather(1, torch.sort(scores.gather(1, by_level), dim=1, descending=True, stable=True).indices)
    kept = order[:, :size]  # [R, N] node indices in the full list
    # renumber parents: full-list index -> verify slot (0 = the anchor, j + 1 = kept node j)
    slot_of = torch.zeros_like(tokens)  # [R, M]
    slot_of.scatter_(1, kept, torch.arange(1, size + 1, device=tokens.device).expand_as(kept))
    old_parent = parents.gather(1, kept)  # [R, N] (-1: the anchor)
    new_parent = torch.where(old_parent < 0, 0, slot_of.gather(1, old_parent.clamp(min=0)))
    return DraftTree(
        tokens=tokens.gather(1, kept), parents=new_parent, levels=levels.gather(1, kept), scores=scores.gather(1, kept)
    )


def graft_branch(
    tree: DraftTree, branches: list[torch.Tensor], size: int | None = None, token_logprob: float | list[float] = 0.0
) -> DraftTree:
    """Merge one chain of proposed tokens per row (branches[r] [k_r], continuing from the anchor) into the tree: the
    branch follows existing nodes while their tokens agree, then continues as new nodes; rows are padded to the widest
    with NO_NODE nodes under the anchor.

    With `size`, each row keeps its `size` most likely nodes: the branch's token at level l scores (l + 1) *
    `token_logprob` (each of its tokens accepted with probability exp(token_logprob); one value, or one per row), the
    tree's nodes their path's log-probability under the drafter (`tree.scores`), a shared node the larger of the two."""
    rows = []
    n, width = tree.tokens.shape
    scores = tree.scores.tolist() if tree.scores is not None else [[0.0] * width] * n
    rates = token_logprob if isinstance(token_logprob, list) else [token_logprob] * n
    for tokens, parents, levels, row_scores, branch, rate in zip(
        tree.tokens.tolist(), tree.parents.tolist(), tree.levels.tolist(), scores, branches, rates
    ):
        row_scores = [s if t != NO_NODE else -math.inf for s, t in zip(row_scores, tokens)]
        child = {(p, t): j + 1 for j, (p, t) in enumerate(zip(parents, tokens))}  # (parent slot, token) -> slot
        slot = 0
        for level, token in enumerate(branch.tolist()):
            nxt = child.get((slot, token))
            if nxt is None:  # a new node: the slot after the last one
                tokens, parents, levels = tokens + [token], parents + [slot], levels + [level]
                row_scores = row_scores + [-math.inf]
                nxt = child[slot, token] = len(tokens)
            slot = nxt
            row_scores[slot - 1] = max(row_scores[slot - 1], (level + 1) * rate)
        row = (tokens, parents, levels)
        rows.append(row if size is None else _most_likely(row, row_scores, size))
    width = max(len(t) for t, _, _ in rows)
    pad = lambda values, fill: [v + [fill] * (width - len(v)) for v in values]  # noqa: E731
    as_tensor = lambda values: torch.tensor(values, dtype=torch.long, device=tree.tokens.device)  # noqa: E731
    return DraftTree(
        tokens=as_tensor(pad([t for t, _, _ in rows], NO_NODE)),
        parents=as_tensor(pad([p for _, p, _ in rows], 0)),
        levels=as_tensor(pad([lv for _, _, lv in rows], 0)),
    )


def _most_likely(row: tuple[list, list, list], scores: list[float], size: int) -> tuple[list, list, list]:
    """One row's (tokens, parents, levels), a node's parent before it, and each node's score (never above its
    parent's) -> its `size` best-scored nodes in slot order (ties: the earlier slot, so every kept node's ancestors
    are kept), with parents renumbered to the kept slots; padding nodes (-inf) are dropped."""
    tokens, parents, levels = row
    best = sorted(range(len(tokens)), key=lambda j: -scores[j])[:size]  # stable: earlier slots first on ties
    kept = sorted(j for j in best if scores[j] > -math.inf)
    renumber = {old + 1: new for new, old in enumerate(kept, start=1)} | {0: 0}
    return [tokens[j] for j in kept], [renumber[parents[j]] for j in kept], [levels[j] for j in kept]


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """parents [R, N] (verify slot of each node's parent) -> [R, N + 1, N + 1] bool: slot i attends slot j iff j is
    i or one of its ancestors (slot 0, the anchor, is everyone's)."""
    n, size = parents.shape
    width = size + 1
    eye = torch.eye(width, dtype=torch.bool, device=parents.device)
    mask = eye.expand(n, width, width).clone()
    rows = torch.arange(n, device=parents.device)
    for i in range(1, width):  # parents come first, so their rows are complete
        mask[:, i] |= mask[rows, parents[:, i - 1]]
    return mask


def accept_tree(
    tree: DraftTree,
    choice: torch.Tensor | Callable[[int, int], int],  # [R, N + 1], or (row, slot) -> token (see below)
    caps: torch.Tensor,  # [R] the most drafts each row may accept
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Acceptance on a tree -> (emitted [R, N + 1]: the accepted path's drafts, then the target's token after them,
    then -1; num_acc [R]; order [R, N + 1]: the verify slots with the anchor and the accepted path first, in path
    order, then the others).

    `choice` gives the target's token after each verify slot (anchor first): a tensor of them (greedy), or a function
    (row, slot) -> token called once for each slot the walk reaches (sampling: it draws there, and a draw at a slot the
    walk never reaches would go unused). The walk runs on Python lists: a tree has a few dozen slots per row, and one
    tensor op per slot cost ~0.6 ms of a ~43 ms batch-1 step (bf16, 2-core CPU), about ten times the walk."""
    width = tree.tokens.shape[1] + 1
    picks = choice.tolist() if isinstance(choice, torch.Tensor) else None
    emitted, num_acc, order = [], [], []
    for row, (tokens, parents, cap) in enumerate(zip(tree.tokens.tolist(), tree.parents.tolist(), caps.tolist())):
        pick = picks[row].__getitem__ if picks is not None else functools.partial(choice, row)
        child: dict[tuple[int, int], int] = {}
        for j, key in enumerate(zip(parents, tokens)):  # (parent slot, token) -> slot (a node's children differ)
            child.setdefault(key, j + 1)
        path, token = [0], pick(0)  # the anchor's slot, then the accepted nodes'; the target's token after the last
        while len(path) <= cap and (nxt := child.get((path[-1], token))) is not None:
            path.append(nxt)  # a node's level is its depth on the path: level < cap
            token = pick(nxt)
        on_path = set(path)
        order.append(path + [s for s in range(width) if s not in on_path])
        emitted.append([tokens[s - 1] for s in path[1:]] + [token] + [-1] * (width - len(path)))
        num_acc.append(len(path) - 1)
    as_tensor = lambda values: torch.tensor(values, dtype=torch.long, device=tree.tokens.device)  # noqa: E731
    return as_tensor(emitted), as_tensor(num_acc), as_tensor(order)
