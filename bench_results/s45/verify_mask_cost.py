"""What a batch-1 verify forward of 12 tokens costs with and without a 4D mask: the target (bf16, prepacked) over a
~200-token context, one forward of 1 token (a plain step), of 12 tokens with no mask (causal), with the same causal
pattern as a 4D bool mask, and with a tree's 4D mask; the cache is cropped back after each. Interleaved, medians.

    OMP_NUM_THREADS=2 python bench_results/s45/verify_mask_cost.py
"""
import statistics
import time

import torch
from transformers import DynamicCache

from hf_dspark.targets import fast_dtype, load_target

model, tok = load_target("smollm2-135m-instruct", dtype=fast_dtype())
C, W = 200, 12
ids = torch.randint(100, 40000, (1, C))
cache = DynamicCache()
with torch.no_grad():
    model(input_ids=ids, cache=cache, use_cache=True)
new = torch.randint(100, 40000, (1, W))
pos = torch.arange(C, C + W)[None]
causal = torch.ones(W, C + W, dtype=torch.bool).tril(C)[None, None]  # [1, 1, W, C + W]
tree = causal.clone()
tree[0, 0, :, C:] = False
parents = [0, 0, 0, 1, 1, 2, 4, 4, 6, 7, 9, 10]  # slot i's parent slot (slot 0: the anchor)
for i in range(W):
    j = i
    tree[0, 0, i, C + j] = True
    while j:
        j = parents[j]
        tree[0, 0, i, C + j] = True
taps = [10, 20, 30]
cases = {
    "1 token (plain step)": dict(input_ids=new[:, :1], position_ids=pos[:, :1]),
    "12 tokens, no mask": dict(input_ids=new, position_ids=pos),
    "12 tokens, causal as a 4D mask": dict(input_ids=new, position_ids=pos, attention_mask=causal),
    "12 tokens, tree 4D mask": dict(input_ids=new, position_ids=pos, attention_mask=tree),
}
times = {k: [] for k in cases}
with torch.no_grad():
    for rnd in range(25):
        for name, kw in cases.items():
            t0 = time.perf_counter()
            model(**kw, cache=cache, use_cache=True, output_hidden_states=True)
            dt = time.perf_counter() - t0
            cache.crop(-kw["input_ids"].shape[1])
            if rnd >= 3:
                times[name].append(dt)
for name, ts in times.items():
    print(f"{name:34s} {statistics.median(ts) * 1e3:6.2f} ms")
