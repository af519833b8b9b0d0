import random, statistics, sys, time, torch
from transformers.cache_utils import DynamicCache
import hf_dspark.prepack as P
from hf_dspark.targets import load_target
from hf_dspark.attention import grouped_kv_heads_under_masks
model, tok = load_target("smollm2-135m-instruct", dtype=torch.bfloat16)
C = 150
ids = torch.randint(100, 20000, (1, C))
cache = DynamicCache(config=model.config)
with torch.no_grad(): model(input_ids=ids, past_key_values=cache, use_cache=True)
def crop():
    n = cache.get_seq_length() - C
    if n: cache.crop(-n)
lin = [m for m in model.modules() if isinstance(m, P.PrepackedLinear)]
packs = {}
for h in (1, 8, 12, 16):
    packs[h] = [torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), h) for m in lin]
def use(h):
    for m, p in zip(lin, packs[h]): m._packed = p
def run(h, w):
    use(h)
    q = torch.randint(100, 20000, (1, w)); pos = torch.arange(C, C + w)[None]
    m4 = torch.cat([torch.ones(1, 1, w, C, dtype=torch.bool), torch.ones(w, w, dtype=torch.bool).tril()[None, None]], -1)
    with torch.no_grad(), grouped_kv_heads_under_masks(model, w):
        model(input_ids=q, position_ids=pos, attention_mask=None if w == 1 else m4, past_key_values=cache, use_cache=True)
    crop()
keys = [(h, w) for h in (1, 8, 12, 16) for w in (1, 8, 12, 16)]
T = {k: [] for k in keys}
for k in keys:
    for _ in range(3): run(*k)
order = keys * 40; random.seed(1); random.shuffle(order)
for k in order:
    t = time.perf_counter(); run(*k); T[k].append(time.perf_counter() - t)
for h in (1, 8, 12, 16):
    print(f"hint {h:2d}: " + "  ".join(f"w{w}={1e3*statistics.median(T[(h, w)]):.2f}" for w in (1, 8, 12, 16)))
