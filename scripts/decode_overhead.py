"""Decode-only cost of plain steps through our loop (FixedLength(0), no drafter pass) vs generate(): 4 paired calls
timed by `hf_dspark.bench.Bench` (decode speedup = prefill taken out), then the time per decode step spent inside
and outside the target's forward (forward hooks; the inside part is the same forward for both, so its difference
is this machine's noise unless our inputs slow it down), one decode forward from the same cache state with and
without the drafter's hidden-state taps (12 alternating calls: does asking for the taps slow the forward?), and a
cProfile of the decode part.
`OMP_NUM_THREADS=2 python scripts/decode_overhead.py 32` (batch size)."""
import cProfile
import pstats
import statistics
import sys
import time

import torch
from transformers.cache_utils import DynamicCache

from hf_dspark.bench import Bench, decode_seconds, default_drafter, load_prompts, markdown_table
from hf_dspark.modeling import DSparkDrafter
from hf_dspark.scheduler import FixedLength
from hf_dspark.targets import load_target

bs = int(sys.argv[1])
model, tok = load_target("smollm2-135m-instruct", dtype="float32")
drafter = DSparkDrafter.from_pretrained(str(default_drafter()), target=model)
kw = dict(max_new_tokens=32, do_sample=False)
loop_plain = lambda enc: model.generate(**enc, **kw, assistant_model=drafter, verify_policy=FixedLength(0))  # noqa: E731
bench = Bench(model, tok, drafter, max_new_tokens=32, custom_runners={"loop_plain_steps": loop_plain})
plain, loop = bench.run("gsm8k", load_prompts("gsm8k", bs), bs, ["plain", "loop_plain_steps"], repeats=4)
print(markdown_table([plain, loop]))
print("decode ratio per pair (plain / loop):", [round(a[0] / b[0], 3) for a, b in zip(decode_seconds(plain), decode_seconds(loop))])

enc = bench.encode(load_prompts("gsm8k", bs))
for name, run in [("plain", bench.runner("plain")), ("loop_plain_steps", loop_plain)] * 2:  # inside / outside the forwards
    spans = []  # [start, end] of each target forward; the first is the prefill
    pre = model.register_forward_pre_hook(lambda *_: spans.append([time.perf_counter(), None]))
    post = model.register_forward_hook(lambda *_: spans[-1].__setitem__(1, time.perf_counter()))
    run(enc)
    end = time.perf_counter()
    pre.remove(), post.remove()
    inside = sum(e - s for s, e in spans[1:])
    outside = end - spans[0][1] - inside
    steps = len(spans) - 1
    print(f"{name}: per decode step {1000 * inside / steps:.0f} ms in the target's forward, {1000 * outside / steps:.1f} ms outside")
with torch.no_grad():  # the same decode forward, with and without the taps, from one cache state
    ids, attn = enc["input_ids"], enc["attention_mask"]
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    nxt = model(input_ids=ids, attention_mask=attn, position_ids=pos, cache=cache, logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)
    step = dict(input_ids=nxt, attention_mask=torch.cat([attn, torch.ones_like(nxt)], 1), position_ids=pos[:, -1:] + 1, logits_to_keep=1)
    forward_s = {"without taps": [], "with taps": []}
    for _ in range(12):
        for name, extra in [("without taps", {}), ("with taps", {"output_hidden_states": drafter.tap_hidden_state_ids})]:
            t0 = time.perf_counter()
            model(**step, cache=cache, **extra)
            forward_s[name].append(time.perf_counter() - t0)
            cache.crop(-1)
    print("one decode forward, median of 12:", {k: f"{1000 * statistics.median(v):.0f} ms" for k, v in forward_s.items()})
for name, run in [("plain", bench.runner("plain")), ("loop_plain_steps", loop_plain)]:
    profiler, started = cProfile.Profile(), []

    def start_after_prefill(*_):  # profile only the decode part
        if not started:
            started.append(1)
            profiler.enable()

    hook = model.register_forward_hook(start_after_prefill)
    run(enc)
    profiler.disable()
    hook.remove()
    print("=====", name)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(22)
