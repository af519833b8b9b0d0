"""How our target forwards of several tokens run transformers' SDPA attention.

transformers' SDPA attention repeats the key/value heads of grouped-query attention whenever a mask is passed (it
hands `enable_gqa` to torch only without one), and a verify forward passes one (a tree's, or a chain's causal mask
over the cache). torch's CPU kernel takes the mask with `enable_gqa`, bitwise the same and cheaper: a 12-token
forward of SmolLM2 (bf16, 2-core AMX CPU) over 250 / 1,000 tokens of context, 42.2 -> 40.0 / 52.2 -> 45.5 ms
(`bench_results/s46/gqa_verify.py`). transformers reads `SDPA_FORCE_GQA` at every attention call, so the loop's target
forwards of several tokens on a CPU, and the step table's probes of them, set it while they run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from transformers import PreTrainedModel

SDPA_FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"


def keeps_grouped_kv_heads(model: PreTrainedModel) -> bool:
    """Whether our forwards of several tokens on this model's device keep grouped key/value heads under a mask."""
    return model.device.type == "cpu"


@contextlib.contextmanager
def grouped_kv_heads_under_masks(model: PreTrainedModel, num_tokens: int) -> Iterator[None]:
    """A target forward of `num_tokens` tokens per row: on a CPU with several, transformers' SDPA attention keeps
    grouped key/value heads as they are under a mask too, unless the caller set the variable. (One token keeps
    transformers' own path, ~1% faster than enable_gqa there.)"""
    if num_tokens == 1 or not keeps_grouped_kv_heads(model) or SDPA_FORCE_GQA in os.environ:
        yield
        return
    os.environ[SDPA_FORCE_GQA] = "1"
    try:
        yield
    finally:
        os.environ.pop(SDPA_FORCE_GQA, None)
