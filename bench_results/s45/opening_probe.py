"""The scheduler's opening probe, side by side in one process: plain generate(), the scheduler without it
(`opening_budget=0`, the scheduler before session 45) and with it (the default, 2% of a call's plain time), each
its own AdaptiveVerification built as generate() builds its own (the drafter's calibration, its held-out tau as the
prior, the same step table, carry_over). Greedy bf16, paired medians against plain.

    OMP_NUM_THREADS=2 python bench_results/s45/opening_probe.py --batch-sizes 8,16 --n 16 --repeats 2
"""
import argparse
import json
from dataclasses import asdict

from hf_dspark import DSparkDrafter
from hf_dspark.bench import Bench, default_drafter, load_prompts, markdown_table
from hf_dspark.scheduler import AdaptiveVerification, prior_survival
from hf_dspark.generation import choose_policy
from hf_dspark.targets import fast_dtype, load_target

p = argparse.ArgumentParser()
p.add_argument("--batch-sizes", default="8,16")
p.add_argument("--n", type=int, default=16)
p.add_argument("--repeats", type=int, default=2)
p.add_argument("--max-new-tokens", type=int, default=64)
p.add_argument("--sets", default="gsm8k,humaneval,mtbench")
p.add_argument("--json", default=None)
args = p.parse_args()
model, tok = load_target("smollm2-135m-instruct", dtype=fast_dtype())
drafter = DSparkDrafter.from_pretrained(default_drafter(), target=model)
table = choose_policy(model, drafter, None, None, True, None, quiet=True).costs.table  # generate()'s own table
temps = drafter.calibration["temperatures"]
prior = prior_survival(drafter.calibration, drafter.config.block_size)


def scheduler(opening_budget: float):
    policy = AdaptiveVerification(table, temperatures=temps, carry_over=True, prior_survival=prior,
                                  opening_budget=opening_budget)
    return lambda enc: model.generate(**enc, max_new_tokens=args.max_new_tokens, do_sample=False,
                                      assistant_model=drafter, verify_policy=policy)


runners = {"scheduler, no opening probe": scheduler(0.0), "scheduler, opening probe": scheduler(0.02)}
bench = Bench(model, tok, drafter, max_new_tokens=args.max_new_tokens, custom_runners=runners)
records = []
for s in args.sets.split(","):
    prompts = load_prompts(s, args.n)
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        records += bench.run(s, prompts, b, ["plain", *runners], args.repeats)
print(markdown_table(records))
if args.json:
    json.dump([asdict(r) for r in records], open(args.json, "w"), indent=1)
