"""Per-step wall time of our loop at fixed draft depths, with synthetic drafts of known acceptance.

    OMP_NUM_THREADS=2 python scripts/step_times_by_depth.py --batch-sizes 1,16,64 --depths 0,1,2,3,5,7 --alpha 0.8

For each batch size: the median step time (`DSparkStats.step_seconds`, prefill excluded) of `FixedLength(k)`
(k = 0: plain steps through our loop, no drafter pass), the drafter's share, tau, and committed tokens per row per
second = tau / step time -- the quantity the scheduler maximizes. Shows where drafting pays on this device.
"""

import argparse
import statistics

import torch

from hf_dspark.bench import Bench, default_drafter, load_prompts, parse_batch_sizes
from hf_dspark.modeling import DSparkDrafter
from hf_dspark.scheduler import FixedLength
from hf_dspark.targets import load_target
from hf_dspark.testing import synthetic_drafts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--drafter", default=str(default_drafter()))
    p.add_argument("--batch-sizes", default="1,16,64")
    p.add_argument("--depths", default="0,1,2,3,5,7")
    p.add_argument("--alpha", type=float, default=0.8, help="synthetic per-token acceptance")
    p.add_argument("--max-new-tokens", type=int, default=32)
    args = p.parse_args()
    model, tok = load_target(args.target, dtype="float32")
    drafter = DSparkDrafter.from_pretrained(args.drafter, target=model)
    bench = Bench(model, tok, drafter, max_new_tokens=args.max_new_tokens)
    sizes = parse_batch_sizes(args.batch_sizes)
    prompts = load_prompts("gsm8k", max(sizes))
    kw = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    print("| batch | depth | step ms (median) | drafter ms | tau | row-tokens/s | identical |")
    print("|---:|---:|---:|---:|---:|---:|:---:|")
    for bs in sizes:
        enc = bench.encode(prompts[:bs])
        ref = model.generate(**enc, **kw)
        for k in (int(x) for x in args.depths.split(",")):
            with synthetic_drafts(ref, args.alpha):
                out = model.generate(**enc, **kw, assistant_model=drafter, verify_policy=FixedLength(k))
            s = drafter.last_stats
            step = statistics.median(s.step_seconds[:-2] or s.step_seconds)  # the last steps run short rows
            draft = s.draft_time_s / max(1, s.drafted_steps)
            tau = s.mean_accepted_length
            print(f"| {bs} | {k} | {step * 1000:.0f} | {draft * 1000:.0f} | {tau:.2f} | {tau / step:.2f} | "
                  f"{'yes' if torch.equal(out, ref) else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
