"""Simulate a static batch under draft-depth rules with a known step-cost model (a model, not a measurement).

    python scripts/simulate_static_batch.py --alpha 0.8 --max-new-tokens 32

Each request needs `--max-new-tokens` tokens; a step at depth L costs `verify0 + per_token * R * (L + 1)` plus a
drafter pass `draft0 + draft_per_depth * L` (defaults fitted by hand to this CPU's batch-64 step times: plain step
~0.55 s, depth 4 ~1.95 s), every draft survives with probability alpha, finished requests leave the batch. Prints
each rule's throughput relative to plain decoding, averaged over `--trials` seeds. Used to ask whether the per-step
rate rule (what `best_depth` maximizes) loses to ragged finishes when the costs are known exactly, and what the
static-batch rule (`static_batch_seconds`, as `AdaptiveVerification(static_batch=True)` uses it) changes, and
what re-measuring the plain step on close calls costs where prices never drift (the default scheduler).
"""

import argparse
import random

import torch

from hf_dspark.scheduler import AdaptiveVerification, FixedLength, VerifyPolicy
from hf_dspark.step_table import StepTimeTable
from hf_dspark.testing import FixedStepCosts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--alpha", type=float, default=0.8)
    p.add_argument("--block-size", type=int, default=7)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--batch-sizes", default="1,4,16,32,64")
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--verify0", type=float, default=0.288)
    p.add_argument("--per-token", type=float, default=0.0041)
    p.add_argument("--draft0", type=float, default=0.05)
    p.add_argument("--draft-per-depth", type=float, default=0.075)
    a = p.parse_args()
    B = a.block_size
    survival = a.alpha ** torch.arange(1, B + 1, dtype=torch.float64)  # [B], exactly calibrated

    def cost(R: int, L: int) -> float:
        return a.verify0 + a.per_token * R * (L + 1) + (a.draft0 + a.draft_per_depth * L if L else 0.0)

    def rule(static_batch: bool, **kw) -> AdaptiveVerification:  # the scheduler itself, the costs known exactly
        costs = FixedStepCosts(lambda R: [cost(R, L) for L in range(B + 1)])
        table = StepTimeTable([1, 2], [2.0, 1.0], max_batch_tokens=2)  # never consulted: the costs are given
        # probe_budget 0: no probes (a probe would never pay here); no step is verified, so the survival stays exact
        return AdaptiveVerification(table, costs=costs, prior_survival=survival, probe_budget=0.0, static_batch=static_batch, **kw)

    def run(R: int, policy: VerifyPolicy, rng: random.Random) -> float:
        left, seconds = [a.max_new_tokens] * R, 0.0
        while left:
            L = min(policy.draft_depth(len(left), B, usable=torch.tensor(left) - 1), max(left) - 1)
            policy.observe_step(len(left), L, cost(len(left), L), 0.0)  # the costs are fixed; the clock moves
            seconds += cost(len(left), L)
            nxt = []
            for u in left:
                acc = 0
                while acc < min(L, u - 1) and rng.random() < a.alpha:
                    acc += 1
                if u - 1 - acc > 0:
                    nxt.append(u - 1 - acc)
            left = nxt
        return seconds

    rules = {f"depth {L}": FixedLength(L) for L in (0, 2, 4, B)}
    rules |= {
        "rate rule": rule(static_batch=False, remeasure_margin=0),
        "static-batch rule": rule(static_batch=True, remeasure_margin=0),
        "+ re-measuring": rule(static_batch=True),  # the default: plain re-measured on close calls (pure cost here)
    }
    for R in (int(x) for x in a.batch_sizes.split(",")):
        times = {name: sum(run(R, rule, random.Random(i)) for i in range(a.trials)) for name, rule in rules.items()}
        print(f"batch {R:3d}: " + "  ".join(f"{name} {times['depth 0'] / t:.2f}x" for name, t in times.items()))


if __name__ == "__main__":
    main()
