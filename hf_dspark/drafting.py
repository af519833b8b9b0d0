"""One drafting round: a single backbone pass over `[anchor, MASK x (B-1)]`, then sequential Markov sampling.

Only the first `depth` <= B slots are turned into tokens (lm_head, Markov bias, sampling, confidence): the lm_head
over the vocabulary is most of a drafter pass, and slots the step will not verify need none of it. The backbone
still sees the whole block, so the first `depth` drafts are the same as those of a full pass.

Slot k predicts the token at p+k+1 ("anchor as first prediction"); a z-lab DFlash drafter (`sample_from_anchor`
False) has one more slot, [anchor, MASK x B], and its draft k comes from slot k+1 (the same token p+k+1).
Sampling goes left to right: l_k = U_k + bias(x_{k-1}), processed exactly like the target's logits, then argmax
(greedy) or a draw from q_k. The confidence logit z_k sees h_k and W1[x_{k-1}], never x_k, so truncating on it is
non-anticipating.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .draft_tree import TREE_TOP_K, DraftTree, grow_tree
from .kernels import exp_noise, first_argmax, markov_sample_block, sample_rows
from .modeling import DSparkDrafter, KVCache
from .processing import Processing


@dataclass
class Draft:
    tokens: torch.Tensor  # [N, L] drafted ids x_0..x_{L-1} (L = depth, B for a full pass; the tree's nodes)
    q: torch.Tensor | None  # [N, L, V] draft distributions (None when greedy: q is one-hot)
    conf_logits: torch.Tensor | None  # [N, L] confidence logits z_k (None without a confidence head, or for a tree)
    tree: DraftTree | None = None  # set when the drafts form a tree (`draft_tree`), not a chain
    branches: list[torch.Tensor] | None = None  # per row [k] the prompt-lookup branch grafted onto the tree


def draft_block(
    drafter: DSparkDrafter,
    anchor: torch.Tensor,  # [N] last committed token per row
    anchor_pos: torch.Tensor,  # [N] its absolute position p
    ctx_kv: KVCache,  # per layer [N, Hk, C, D] context keys/values
    ctx_valid: torch.Tensor,  # [N, C] bool, True where the context slot is a committed token
    processing: Processing,
    prefix: Callable[[int, torch.Tensor], torch.Tensor] | None = None,  # (row, drafts so far [k]) -> input_ids prefix
    markov: bool = True,
    depth: int | None = None,  # draft only drafts 0..depth-1 (default: all block_size of them)
    copy: Callable[[int, list[int]], int | None] | None = None,  # (row, drafts so far) -> a token to draft instead
) -> Draft:
    cfg = drafter.config
    depth = cfg.block_size if depth is None else depth
    hidden, base, state = _backbone(drafter, anchor, anchor_pos, ctx_kv, ctx_valid, markov, depth)
    head = drafter.markov_head if markov else None
    conf = drafter.confidence_head
    conf_reads_w1 = conf is not None and conf.proj.in_features > cfg.hidden_size
    fused = processing.temperature_only and (head.head_type == "vanilla" if head is not None else not conf_reads_w1)
    if not fused or copy is not None:
        return _sequential(drafter, base, hidden, anchor, processing, prefix, markov, state, copy)

    # vanilla head (or none) and at most a temperature: the fused sampler (Triton on CUDA, torch elsewhere), in the
    # draft vocabulary (tokens come back as target ids, q over the D draft ids)
    temperature = 0.0
    if processing.do_sample:
        temperature = float(processing.processors[0].temperature) if processing.processors else 1.0
    noise = exp_noise(*base.shape, device=base.device) if temperature > 0 else None  # [N, depth, D]
    tokens, q, conf_logits = markov_sample_block(
        base,
        hidden.float(),
        anchor,
        head.markov_w1.weight if head is not None else None,  # [V, r]: the sampler converts only the rows it reads
        head.markov_w2.weight.float() if head is not None else None,
        conf.proj.weight[0].float() if conf is not None else None,
        conf.proj.bias.float() if conf is not None else None,
        temperature,
        noise,
        draft_ids=drafter.draft_target_ids(),
    )
    if q is not None:  # verification reads q over the target vocabulary: 0 outside the drafter's
        q = drafter.to_target_vocab(q, fill=0.0)
    return Draft(tokens, q, conf_logits)


def draft_tree(
    drafter: DSparkDrafter,
    anchor: torch.Tensor,  # [N] last committed token per row
    anchor_pos: torch.Tensor,  # [N] its absolute position p
    ctx_kv: KVCache,  # per layer [N, Hk, C, D] context keys/values
    ctx_valid: torch.Tensor,  # [N, C] bool
    processing: Processing,
    prefix: Callable[[int, torch.Tensor], torch.Tensor] | None,
    markov: bool,
    depth: int,  # levels of the tree (draft positions 0..depth-1)
    size: int,  # nodes to verify
    top_k: int = TREE_TOP_K,  # children per expanded node (1: the drafter's best chain, as a tree)
    copy: Callable[[int, list[int]], int | None] | None = None,  # (row, path of k tokens) -> a token to propose after it
    copy_logprob: float = 0.0,  # the log-probability a copied child adds to its parent's path score
) -> Draft:
    """One backbone pass, then a best-first tree of `size` drafts over the first `depth` positions (see
    `hf_dspark.draft_tree`)."""
    hidden, base, state = _backbone(drafter, anchor, anchor_pos, ctx_kv, ctx_valid, markov, depth)
    tree = grow_tree(drafter, base, hidden, anchor, processing, prefix, markov, size, state, top_k=top_k, copy=copy,
                     copy_logprob=copy_logprob)
    return Draft(tokens=tree.tokens, q=None, conf_logits=None, tree=tree)


def _backbone(drafter, anchor, anchor_pos, ctx_kv, ctx_valid, markov: bool, depth: int):
    """The backbone over `[anchor, MASK x (B-1)]` -> hidden [N, depth, H] and U_k [N, depth, D] of the first `depth`
    drafts, and an rnn Markov head's state before the first draft (z-lab layout; else None)."""
    cfg = drafter.config
    n, b = anchor.shape[0], cfg.block_slots
    if not 1 <= depth <= cfg.block_size:
        raise ValueError(f"depth must be in 1..block_size={cfg.block_size}, got {depth}.")
    first = b - cfg.block_size  # the slot of the first draft: 1 when the anchor slot drafts nothing (z-lab DFlash)
    block = torch.full((n, b), cfg.mask_token_id, dtype=torch.long, device=anchor.device)
    block[:, 0] = anchor
    positions = anchor_pos[:, None] + torch.arange(b, device=anchor.device)
    mask = torch.cat(
        [ctx_valid[:, None, None, :].expand(n, 1, b, -1), ctx_valid.new_ones((n, 1, b, b))], dim=-1
    )  # [N, 1, B, C + B]
    slots = drafter.block_hidden(block, positions, ctx_kv, mask)  # [N, slots, H]
    hidden = slots[:, first : first + depth]  # [N, depth, H]
    base = drafter.base_logits(hidden).float()  # [N, depth, D] (D = V unless the draft vocabulary is reduced)
    state = None
    if first and markov:  # z-lab layout: an rnn head's state has already stepped over the anchor slot
        state = drafter.markov_latent(anchor, slots[:, 0])[1]
    return hidden, base, state


def _sequential(drafter, base, hidden, anchor, processing, prefix, markov, state=None, copy=None) -> Draft:
    """General path: any Markov head type and any logits processors (per-row prefixes); `state` [N, r]: the rnn head's
    state before the first draft (None: zeros). `copy(row, drafts so far)` names a token to draft instead of the
    drafter's pick (copy drafting): it is drafted with q one-hot on it, so verification stays exact when sampling."""
    n, b, _ = base.shape
    prev = anchor
    tokens, qs, confs = [], [], []
    # processors that read only scores (temperature, top-k/p, ...) treat the -inf outside a reduced draft vocabulary
    # as absent, so they run over its D columns (as in grow_tree); those that read the prefix get the target's V, and
    # so do copied tokens, which may lie outside the draft vocabulary
    draft_ids = None if processing.reads_prefix or copy is not None else drafter.draft_target_ids()  # [D] or None
    for k in range(b):
        logits = base[:, k]
        if markov:
            latent, state = drafter.markov_latent(prev, hidden[:, k], state)
            if latent is not None:
                logits = logits + drafter.markov_bias(latent).float()
        if draft_ids is None:
            logits = drafter.to_target_vocab(logits)  # [N, V]: -inf where the drafter cannot propose (q = 0 there)
        confs.append(drafter.confidence_logit(hidden[:, k], prev))
        drafted = torch.stack(tokens, dim=1) if tokens else anchor.new_zeros((n, 0))
        row_prefix = (lambda i, d=drafted: prefix(i, d[i])) if prefix is not None else None
        scores = processing(logits, row_prefix)  # [N, D or V]
        q = torch.softmax(scores, dim=-1) if processing.do_sample else None
        x = sample_rows(q) if q is not None else first_argmax(scores)  # sample_rows: multinomial with cheaper noise
        if draft_ids is not None:
            x = draft_ids[x]  # draft id -> target id
            q = drafter.to_target_vocab(q, fill=0.0) if q is not None else None  # [N, V]
        if copy is not None:
            x, q = _copy_drafts(copy, drafted, x, q)
        if q is not None:
            qs.append(q)
        tokens.append(x)
        prev = x
    return Draft(
        torch.stack(tokens, dim=1),
        torch.stack(qs, dim=1) if qs else None,
        torch.stack(confs, dim=1) if confs[0] is not None else None,
    )


def _copy_drafts(copy, drafted: torch.Tensor, x: torch.Tensor, q: torch.Tensor | None):
    """Rows whose `copy(row, drafts so far)` names a token draft it instead of x [N]; their q [N, V] (when sampling)
    becomes one-hot on it, the distribution that token was drawn from."""
    for i, row in enumerate(drafted.tolist()):
        token = copy(i, row)
        if token is None:
            continue
        x[i] = token
        if q is not None:
            q[i] = 0.0
            q[i, token] = 1.0
    return x, q
