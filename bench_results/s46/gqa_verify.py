"""What transformers' SDPA attention costs in a verify forward when it repeats grouped key/value heads (its path
whenever a mask is passed) against torch's enable_gqa under the same mask (TRANSFORMERS_SDPA_FORCE_GQA=1): the target
(bf16, prepacked) over C tokens of context, one forward of 1 and of 12 tokens (a 4D causal mask for 12), interleaved,
medians; the cache is cropped back after each. Also checks that the logits are bitwise the same.

    OMP_NUM_THREADS=2 python bench_results/s46/gqa_verify.py
"""
import os
import statistics
import time

import torch
from transformers import DynamicCache

from hf_dspark.targets import fast_dtype, load_target

model, tok = load_target("smollm2-135m-instruct", dtype=fast_dtype())
taps = [1, 8, 14, 20, 27]
for C in (250, 1000):
    torch.manual_seed(0)
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=torch.randint(100, 40000, (1, C)), cache=cache, use_cache=True)
    times, logits = {}, {}
    for rnd in range(15):
        for width in (1, 12):
            for gqa in ("0", "1"):
                os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = gqa
                mask = torch.ones(width, C + width, dtype=torch.bool).tril(C)[None, None] if width > 1 else None
                with torch.no_grad():
                    start = time.perf_counter()
                    out = model(input_ids=torch.arange(100, 100 + width)[None], position_ids=torch.arange(C, C + width)[None],
                                attention_mask=mask, cache=cache, use_cache=True, output_hidden_states=taps)
                    seconds = time.perf_counter() - start
                cache.crop(-width)
                logits[width, gqa] = out.logits
                if rnd >= 3:
                    times.setdefault((width, gqa), []).append(seconds)
    for (width, gqa), ts in times.items():
        path = "enable_gqa" if gqa == "1" else "repeated K/V heads" if width > 1 else "transformers' one-token path"
        print(f"context {C}, {width:2d} token(s), {path:28s} {statistics.median(ts) * 1e3:6.2f} ms")
    print(f"context {C}: logits bitwise the same: {all(torch.equal(logits[w, '0'], logits[w, '1']) for w in (1, 12))}")
os.environ.pop("TRANSFORMERS_SDPA_FORCE_GQA")
