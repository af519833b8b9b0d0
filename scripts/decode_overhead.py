"""Where a decode step's time goes: plain generate() against our loop running plain steps (FixedLength(0): no
drafter pass) and against the scheduler with the shipped drafter (`dspark_adaptive`, which mostly skips that
drafter), on GSM8K prompts, greedy, 32 new tokens.

1. `hf_dspark.bench.Bench` times the three contenders on the same batches, calls interleaved (paired speedups).
2. Per decode step, the time inside the target's forward and outside it (forward hooks), and the scheduler's own
   time, averaged over 3 passes of alternating calls. The inside part is the same forward for every contender, so
   its difference is this machine's noise unless our inputs slow the forward down.
3. One decode forward from the same cache state with generate()'s inputs and with ours (the drafter's taps
   requested; the attention mask dropped when it is all ones, as both loops do, or always given), 200 calls each
   in shuffled order: what our inputs cost inside the forward. (Medians of 40 calls moved by +-0.8 ms from run to
   run at batch 1 on a 2-core CPU: too few to see the taps' ~0.1 ms.)

`OMP_NUM_THREADS=2 python scripts/decode_overhead.py 1 bfloat16 [4]` (batch size, dtype, batches: default 4)."""
import random
import statistics
import sys
import time

import torch
from transformers.cache_utils import DynamicCache

from hf_dspark.bench import Bench, default_drafter, load_prompts, markdown_table
from hf_dspark.modeling import DSparkDrafter
from hf_dspark.scheduler import FixedLength
from hf_dspark.targets import load_target

bs = int(sys.argv[1])
dtype = sys.argv[2] if len(sys.argv) > 2 else "float32"
n_batches = int(sys.argv[3]) if len(sys.argv) > 3 else 4
model, tok = load_target("smollm2-135m-instruct", dtype=dtype)
drafter = DSparkDrafter.from_pretrained(str(default_drafter()), target=model)
kw = dict(max_new_tokens=32, do_sample=False)
loop_plain = lambda enc: model.generate(**enc, **kw, assistant_model=drafter, verify_policy=FixedLength(0))  # noqa: E731
tokens = [n for n in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512) if n <= 8 * bs]
profile = {"num_requests": (bs,), "batch_tokens": tokens, "context_len": 128, "repeats": 2, "warmup": 1}
bench = Bench(model, tok, drafter, max_new_tokens=32, profile_kwargs=profile, custom_runners={"loop_plain_steps": loop_plain})
prompts = load_prompts("gsm8k", n_batches * bs)
print(markdown_table(bench.run("gsm8k", prompts, bs, ["plain", "loop_plain_steps", "dspark_adaptive"], repeats=3)))

runs = {"plain": bench.runner("plain"), "loop_plain_steps": loop_plain, "dspark_adaptive": bench.runner("dspark_adaptive")}
batches = [bench.encode(prompts[i : i + bs]) for i in range(0, len(prompts), bs)]
per_step = {name: {"inside": [], "outside": [], "scheduler": []} for name in runs}  # ms per decode step, per call
for _ in range(3):
    for enc in batches:
        for name, run in runs.items():
            spans = []  # [start, end] of each target forward; the first is the prefill
            pre = model.register_forward_pre_hook(lambda *_: spans.append([time.perf_counter(), None]))
            post = model.register_forward_hook(lambda *_: spans[-1].__setitem__(1, time.perf_counter()))
            drafter.last_stats = None
            run(enc)
            end = time.perf_counter()
            pre.remove(), post.remove()
            inside, steps = sum(e - s for s, e in spans[1:]), len(spans) - 1
            per_step[name]["inside"].append(1000 * inside / steps)
            per_step[name]["outside"].append(1000 * (end - spans[0][1] - inside) / steps)
            if name != "plain":
                per_step[name]["scheduler"].append(1000 * drafter.last_stats.policy_time_s / drafter.last_stats.steps)
for name, parts in per_step.items():
    print(f"{name}: per decode step (mean of {len(parts['inside'])} calls) "
          + ", ".join(f"{part} {statistics.mean(v):.3f} ms" for part, v in parts.items() if v))

with torch.no_grad():  # one decode forward from one cache state, with generate()'s inputs and with ours
    ids, attn = batches[0]["input_ids"], batches[0]["attention_mask"]
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    nxt = model(input_ids=ids, attention_mask=attn, position_ids=pos, cache=cache, logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)
    mask = torch.cat([attn, torch.ones_like(nxt)], 1)
    dense = bool(mask.all())  # generate() drops an all-ones mask; so does our loop
    taps = drafter.tap_hidden_state_ids
    variants = {
        "generate()'s inputs": {"attention_mask": None if dense else mask, "logits_to_keep": 1},
        "ours": {"attention_mask": None if dense else mask, "output_hidden_states": taps},
        "ours, mask always given": {"attention_mask": mask, "output_hidden_states": taps},
    }
    forward_ms = {name: [] for name in variants}
    for _ in range(200):
        for name, extra in random.sample(list(variants.items()), len(variants)):
            t0 = time.perf_counter()
            model(input_ids=nxt, position_ids=pos[:, -1:] + 1, cache=cache, **extra)
            forward_ms[name].append(1000 * (time.perf_counter() - t0))
            cache.crop(-1)
    print("one decode forward, median of 200 shuffled calls:", {k: f"{statistics.median(v):.2f} ms" for k, v in forward_ms.items()})
