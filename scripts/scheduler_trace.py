"""Trace the scheduler's decisions step by step on one GSM8K batch: requests R, the depth chosen, the predicted
seconds of every depth, the acceptance correction rho, the corrected mean survival, and for a static batch the
one-request step prices and the expected seconds of the rest of the call at every depth (`static_batch_seconds`),
then the measured step and drafter seconds and the accepted drafts. The scheduler is the bench's `dspark_adaptive` one (`Bench.adaptive_policy`), kept across calls. The depth is the
scheduler's choice; the loop may lower it (a request's last token drafts nothing: drafter_s=0, accepted=-).

    OMP_NUM_THREADS=2 python scripts/scheduler_trace.py --batch-size 64 --calls 3
    OMP_NUM_THREADS=2 python scripts/scheduler_trace.py --batch-size 32 --synthetic-acceptance 0.8
    OMP_NUM_THREADS=2 python scripts/scheduler_trace.py --batch-size 64 --after 32 --synthetic-acceptance 0.8
"""

import argparse
import contextlib
import time

import numpy as np

from hf_dspark.bench import Bench, default_drafter, load_prompts
from hf_dspark.modeling import DSparkDrafter
from hf_dspark.scheduler import _static_batch_seconds
from hf_dspark.targets import load_target
from hf_dspark.testing import synthetic_drafts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--after", type=int, default=None, metavar="BATCH_SIZE",
                   help="first run 3 untraced calls at this batch size, as the bench's batch 32-64 run does batch 32 "
                        "before 64 with one scheduler")
    p.add_argument("--synthetic-acceptance", type=float, default=None, metavar="ALPHA",
                   help="draft the batch's own plain output, each token right with probability ALPHA (as the bench)")
    args = p.parse_args()
    model, tok = load_target("smollm2-135m-instruct", dtype="float32")
    drafter = DSparkDrafter.from_pretrained(str(default_drafter()), target=model)
    sizes = sorted({1, 32, args.batch_size} | ({args.after} if args.after else set()))  # as the bench's batch 32-64 run
    tokens = [n for n in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512) if n <= 8 * max(sizes)]
    profile_kwargs = {"num_requests": tuple(sizes), "batch_tokens": tokens, "context_len": 128, "repeats": 2, "warmup": 1}
    bench = Bench(model, tok, drafter, None, args.max_new_tokens, profile_kwargs, args.synthetic_acceptance)
    policy = bench.adaptive_policy()
    choose, observe, trace = policy.draft_depth, policy.observe_step, []

    def traced_depth(n, block_size, usable=None, pending_columns=0):
        survival = policy._decision_survival(block_size)  # what the decision below uses
        depth = choose(n, block_size, usable, pending_columns)
        seconds = policy.costs.seconds(n, block_size).numpy()
        line = f"R={n} depth={depth} predicted_s={np.round(seconds, 3).tolist()} rho={policy.acceptance_ratio:.3f}"
        if survival is not None:
            line += f" survival={np.round(survival, 2).tolist()}"
            if usable is not None and n > 1:  # what the static-batch model expects for the rest of the call
                one = policy.costs.seconds(1, block_size).numpy()
                call_s = _static_batch_seconds(np.asarray(survival), seconds, one, np.asarray(usable))
                line += f" one_s={np.round(one, 3).tolist()} call_s={np.round(call_s, 2).tolist()}"
        trace.append(line)
        return depth

    def traced_observe(n, depth, step_s, draft_s, accepted=None, catch_up=None):
        acc = "-" if accepted is None else int(accepted.sum())
        trace[-1] += f" measured_s={step_s:.3f} drafter_s={draft_s:.3f} accepted={acc}"
        if catch_up is not None:
            trace[-1] += f" catch_up_s={catch_up[1]:.3f} ({catch_up[0]} request-columns)"
        observe(n, depth, step_s, draft_s, accepted, catch_up)

    policy.draft_depth, policy.observe_step = traced_depth, traced_observe

    def calls(batch_size: int, n: int, seed0: int = 0):
        """Run n scheduler calls on a GSM8K batch -> (call, its seconds) after each (synthetic drafts continue each
        row's own plain output, one draw per call)."""
        enc = bench.encode(load_prompts("gsm8k", batch_size))
        reference = None
        if args.synthetic_acceptance is not None:
            reference = model.generate(**enc, max_new_tokens=args.max_new_tokens, do_sample=False)
        for call in range(n):
            trace.clear()
            t0 = time.perf_counter()
            drafts = contextlib.nullcontext() if reference is None else synthetic_drafts(reference, args.synthetic_acceptance, seed=seed0 + call)
            with drafts:
                model.generate(**enc, max_new_tokens=args.max_new_tokens, do_sample=False, assistant_model=drafter, verify_policy=policy)
            yield call, time.perf_counter() - t0

    if args.after:
        for _ in calls(args.after, 3, seed0=100):
            pass
    for call, seconds in calls(args.batch_size, args.calls):
        print(f"call {call}: {seconds:.1f} s")
        print("\n".join(trace))


if __name__ == "__main__":
    main()
