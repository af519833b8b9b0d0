"""Cheap draws on a CPU: `sample_index` (one index from a probability row), `sample_rows` (one per row of a batch) and
`exp_noise` (Exp(1) noise).

torch.multinomial draws one sample as the argmax of probs / Exp(1) noise, and this torch build's CPU exponential_
costs ~28 ns per element: 1.4 ms for one row of SmolLM2's 49,152 probabilities (2-core CPU), against 0.06 ms for a
cumulative sum and a binary search, and 11 ms for the [4, 7, 16384] noise of a 4-request chain step, against 2.5 ms
for -log(U) of uniforms. Each draws what it replaces, up to fp32 rounding. `python -m hf_dspark.kernels.sampling`
times them.
"""

from __future__ import annotations

import torch

from .argmax import first_argmax


def sample_index(probs: torch.Tensor) -> int:
    """probs [V] non-negative (need not sum to 1; at least one positive) -> one index i drawn with probability
    probs[i] / sum(probs): the first i whose cumulative sum exceeds u * sum, u ~ U[0, 1). Zero entries are never drawn."""
    cdf = probs.float().cumsum(0)  # [V]
    u = torch.rand((), device=probs.device) * cdf[-1]
    index = int(torch.searchsorted(cdf, u[None], right=True))
    if index >= probs.shape[0]:  # u * sum rounded up to the sum: the last index that can be drawn
        index = int(probs.nonzero().max())
    return index


def exp_noise(*shape: int, device: torch.device | str | None = None) -> torch.Tensor:
    """[*shape] float32 i.i.d. Exp(1) samples, as -log(U) for U ~ U[0, 1) (U = 0 gives inf: a draw of probs / noise
    then never takes that entry, which Exp(1) noise takes with probability 0)."""
    return torch.rand(shape, device=device).log_().neg_()


def sample_rows(probs: torch.Tensor) -> torch.Tensor:
    """probs [..., V] non-negative rows -> [...] int64, one index per row drawn with probability probs[i] / sum: the
    argmax of probs / Exp(1) noise, torch.multinomial's own method, with `exp_noise`."""
    return first_argmax(probs / exp_noise(*probs.shape, device=probs.device))


if __name__ == "__main__":
    import time

    p = torch.softmax(3 * torch.randn(49152), 0)
    draws = (("torch.multinomial", lambda: torch.multinomial(p, 1)), ("sample_index", lambda: sample_index(p)),
             ("exponential_ [4, 7, 16384]", lambda: torch.empty(4, 7, 16384).exponential_()),
             ("exp_noise [4, 7, 16384]", lambda: exp_noise(4, 7, 16384)),
             ("torch.multinomial [4, 49152]", lambda: torch.multinomial(p.expand(4, -1), 1)),
             ("sample_rows [4, 49152]", lambda: sample_rows(p.expand(4, -1))))
    for name, draw in draws:
        draw()
        start = time.perf_counter()
        for _ in range(100):
            draw()
        print(f"{name:28s} {(time.perf_counter() - start) * 10:.3f} ms")
