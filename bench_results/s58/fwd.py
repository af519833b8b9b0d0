import random, statistics, time, torch
from transformers.cache_utils import DynamicCache
from hf_dspark.targets import load_target
from hf_dspark.attention import grouped_kv_heads_under_masks
model, tok = load_target("smollm2-135m-instruct", dtype=torch.bfloat16)
C, W = 120, 12
ids = torch.randint(100, 20000, (1, C))
cache = DynamicCache(config=model.config)
with torch.no_grad():
    model(input_ids=ids, past_key_values=cache, use_cache=True)
def crop():
    n = cache.get_seq_length() - C
    if n: cache.crop(-n)
q = torch.randint(100, 20000, (1, W)); pos = torch.arange(C, C + W)[None]
causal = torch.ones(W, W, dtype=torch.bool).tril()
m4 = torch.cat([torch.ones(1, 1, W, C, dtype=torch.bool), causal[None, None]], -1)
q1 = q[:, :1]; pos1 = pos[:, :1]
cases = {
 "1tok": lambda: model(input_ids=q1, position_ids=pos1, past_key_values=cache, use_cache=True),
 "1tok+hs": lambda: model(input_ids=q1, position_ids=pos1, past_key_values=cache, use_cache=True, output_hidden_states=True),
 "12 causal nomask": lambda: model(input_ids=q, position_ids=pos, past_key_values=cache, use_cache=True),
 "12 4d": lambda: model(input_ids=q, position_ids=pos, attention_mask=m4, past_key_values=cache, use_cache=True),
 "12 4d+hs": lambda: model(input_ids=q, position_ids=pos, attention_mask=m4, past_key_values=cache, use_cache=True, output_hidden_states=True),
 "12 4d+hs gqa": "gqa",
 "12 model.model 4d gqa": "mm",
}
def run(name):
    f = cases[name]
    with torch.no_grad():
        if f == "gqa":
            with grouped_kv_heads_under_masks(model, W):
                model(input_ids=q, position_ids=pos, attention_mask=m4, past_key_values=cache, use_cache=True, output_hidden_states=True)
        elif f == "mm":
            with grouped_kv_heads_under_masks(model, W):
                model.model(input_ids=q, position_ids=pos, attention_mask=m4, past_key_values=cache, use_cache=True, output_hidden_states=True)
        else: f()
    crop()
times = {k: [] for k in cases}
for k in cases:
    for _ in range(5): run(k)
order = list(cases) * 60
random.seed(0); random.shuffle(order)
for k in order:
    t = time.perf_counter(); run(k); times[k].append(time.perf_counter() - t)
for k, v in times.items(): print(f"{k:24s} {1e3*statistics.median(v):6.2f} ms")
