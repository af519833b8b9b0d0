"""The default for a batch, before and after session 43, side by side in one process: plain generate(), the
scheduler (what a batch got by default before: `adaptive_verification=True` is the same policy from the same cached
step table), and `dspark_default` (a call that names no option: now a tree of `default_tree_size(..., num_rows)`
drafts with a prompt-lookup branch where the step table prices it, the scheduler elsewhere).

    OMP_NUM_THREADS=2 python bench_results/s43/batch_default.py --batch-sizes 2,4,8 --n 8 --repeats 2
"""
import argparse
import json
from dataclasses import asdict

from hf_dspark import DSparkDrafter
from hf_dspark.bench import Bench, default_drafter, load_prompts, markdown_table
from hf_dspark.generation import choose_policy, default_tree_size
from hf_dspark.targets import fast_dtype, load_target

p = argparse.ArgumentParser()
p.add_argument("--batch-sizes", default="2,4,8")
p.add_argument("--n", type=int, default=8)
p.add_argument("--repeats", type=int, default=2)
p.add_argument("--max-new-tokens", type=int, default=64)
p.add_argument("--json", default=None)
args = p.parse_args()
model, tok = load_target("smollm2-135m-instruct", dtype=fast_dtype())
drafter = DSparkDrafter.from_pretrained(default_drafter(), target=model)
sizes = [int(b) for b in args.batch_sizes.split(",")]
policy = choose_policy(model, drafter, verify_policy=None, confidence_threshold=None, adaptive_verification=None,
                       num_speculative_tokens=None, quiet=True)
print("default tree per batch size:", {b: default_tree_size(model, drafter, policy, b) for b in sizes})
scheduler = lambda enc: model.generate(**enc, max_new_tokens=args.max_new_tokens, do_sample=False,  # noqa: E731
                                       assistant_model=drafter, adaptive_verification=True)
bench = Bench(model, tok, drafter, max_new_tokens=args.max_new_tokens, custom_runners={"scheduler (old batch default)": scheduler})
records = []
for s in ("gsm8k", "humaneval", "mtbench"):
    prompts = load_prompts(s, args.n)
    for b in sizes:
        records += bench.run(s, prompts, b, ["plain", "scheduler (old batch default)", "dspark_default"], args.repeats)
print(markdown_table(records))
if args.json:
    json.dump([asdict(r) for r in records], open(args.json, "w"), indent=1)
