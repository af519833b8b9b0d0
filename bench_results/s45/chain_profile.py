"""torch.profiler over one generate call that verifies the drafter's full chain for a batch of prompts: the ops
that take the most CPU time, grouped by input shape (what found the per-step [49152, 64] conversion of the Markov
head's embedding and the [8, 8, 49152] boolean gather of the verify logits in session 45).

    OMP_NUM_THREADS=2 python bench_results/s45/chain_profile.py --prompts gsm8k --batch 8
"""

import argparse

import torch

from hf_dspark import DSparkDrafter
from hf_dspark.bench import default_drafter, load_prompts
from hf_dspark.targets import fast_dtype, load_target

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--prompts", default="gsm8k")
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--rows", type=int, default=25, help="table rows to print")
args = parser.parse_args()
model, tok = load_target("smollm2-135m-instruct", dtype=fast_dtype())
drafter = DSparkDrafter.from_pretrained(default_drafter(), target=model)
texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
         for p in load_prompts(args.prompts, args.batch)]
enc = tok(texts, return_tensors="pt", padding=True)
kw = dict(max_new_tokens=64, do_sample=False, assistant_model=drafter, adaptive_verification=False)
model.generate(**enc, **kw)  # warm-up
with torch.profiler.profile(record_shapes=True) as prof:
    model.generate(**enc, **kw)
print(f"{drafter.last_stats.steps} steps")
print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=args.rows))
