"""The exact joint distribution of the first tokens of plain sampling, and the chi-square test against it."""

import itertools

import torch
from scipy.stats import chisquare


def exact_joint(model, prompt: torch.Tensor, warpers, vocab_size: int, num_tokens: int) -> torch.Tensor:
    """P(x1..xn | prompt) of plain sampling with `warpers`, over all vocab_size^n continuations (in product order)."""
    seqs = torch.tensor(list(itertools.product(range(vocab_size), repeat=num_tokens)))
    full = torch.cat([prompt.expand(seqs.shape[0], -1), seqs], dim=1)
    with torch.no_grad():
        logits = model(full).logits[:, prompt.shape[1] - 1 : -1].float()
    logp = torch.zeros(seqs.shape[0])
    for k in range(num_tokens):
        scores = logits[:, k]
        for w in warpers:
            scores = w(full, scores)
        logp += torch.log_softmax(scores, -1).gather(1, seqs[:, k : k + 1]).squeeze(1)
    return logp.exp()


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of observed `counts` per cell against the cell probabilities `probs` (cells expecting < 5 lumped)."""
    expected = probs * counts.sum()
    big = expected >= 5
    obs, exp = counts[big], expected[big]
    if expected[~big].sum() > 0:  # lump the rare cells into one
        obs = torch.cat([obs, counts[~big].sum(0, keepdim=True)])
        exp = torch.cat([exp, expected[~big].sum(0, keepdim=True)])
    return float(chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)
