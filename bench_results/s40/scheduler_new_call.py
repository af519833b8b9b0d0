"""The DSpark scheduler before and after session 40's change to `AdaptiveVerification.reset()`, side by side in one
process on the demo's three prompts (bf16, greedy, batch 1, 64 new tokens, the shipped drafter).

Before: a carried-over scheduler kept the last call's drafted-step survival, skip run and probe schedule, so a text
that ended on drafts the head doubted made the next call start with plain steps until a probe (~1% of the skipped
time) fired. After: each call starts from the drafter's prior (held-out tau), scaled by the carried rho.
Each policy keeps its own state and step costs across its calls, as the drafter's own scheduler does. Warm-up, then
REPEATS timed runs taken in turn (plain generate(), the full block, before, after); medians.

    OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 python bench_results/s40/scheduler_new_call.py
"""
import sys

import numpy as np
import torch

sys.path.insert(0, "examples")
import demo  # noqa: E402

import hf_dspark  # noqa: E402
from hf_dspark.bench import default_drafter  # noqa: E402
from hf_dspark.scheduler import AdaptiveVerification  # noqa: E402
from hf_dspark.targets import fast_dtype, load_target  # noqa: E402

REPEATS = 3


class CarriedTail(AdaptiveVerification):
    """The scheduler as it was before session 40: reset() kept the survival and probe state (carry_over)."""

    def reset(self) -> None:
        self._skip_run = None

    def _decision_survival(self, block_size):
        if self._decision is not None and self._decision[0] == block_size:
            return self._decision[1]
        s = None
        if self._survival is not None and self._survival.shape[1] == block_size:
            s = (np.minimum(self._survival * self.acceptance_ratio, 1.0) if self._outcomes else self._survival).mean(0).tolist()
        elif self.prior_survival is not None and self.prior_survival.shape[1] == block_size:
            s = self.prior_survival[0].tolist()
        self._decision = (block_size, s)
        return s


def main() -> None:
    torch.manual_seed(0)
    model, tok = load_target(demo.TARGET, dtype=fast_dtype())
    drafter = hf_dspark.DSparkDrafter.from_pretrained(default_drafter(), target=model)
    assert demo.has_step_table(model)
    kw = dict(max_new_tokens=demo.MAX_NEW_TOKENS, do_sample=False)
    enc = tok(demo.chat(tok, demo.PROMPTS["math"]), return_tensors="pt")
    model.generate(**enc, **kw, assistant_model=drafter, adaptive_verification=True)  # creates the drafter's scheduler
    key, new = drafter._dspark_scheduler
    old = CarriedTail(new.costs.table, temperatures=new.temperatures, carry_over=True, prior_survival=new.prior_survival)
    new = AdaptiveVerification(new.costs.table, temperatures=new.temperatures, carry_over=True, prior_survival=new.prior_survival)

    def scheduled(policy):
        def run():
            drafter._dspark_scheduler = (key, policy)
            model.generate(**enc, **kw, assistant_model=drafter, adaptive_verification=True)
            s = drafter.last_stats
            plain_steps[policy].append(s.steps - s.drafted_steps)
            taus[policy].append(s.mean_accepted_length)
        return run

    totals = {c: 0.0 for c in ("plain", "full block", "before", "after")}
    for label, prompt in demo.PROMPTS.items():
        enc = tok(demo.chat(tok, prompt), return_tensors="pt")
        plain_steps, taus = {old: [], new: []}, {old: [], new: []}
        runs = {
            "plain": lambda: model.generate(**enc, **kw),
            "full block": lambda: model.generate(**enc, **kw, assistant_model=drafter, adaptive_verification=False),
            "before": scheduled(old),
            "after": scheduled(new),
        }
        for run in runs.values():
            run()  # warm-up
        med = demo.medians_in_turn(runs, REPEATS)
        for c in totals:
            totals[c] += med[c]
        print(f"{label}: plain {med['plain']:.2f} s; " + "; ".join(
            f"{c} {med[c]:.2f} s ({med['plain'] / med[c]:.2f}x)" for c in ("full block", "before", "after")))
        for c, p in (("before", old), ("after", new)):
            print(f"   {c}: plain steps per timed call {plain_steps[p][1:]}, tau {[round(t, 2) for t in taus[p][1:]]}")
    print("overall: " + "; ".join(f"{c} {totals['plain'] / totals[c]:.2f}x" for c in ("full block", "before", "after"))
          + f" of plain generate() ({totals['plain']:.2f} s), {torch.get_num_threads()} threads, medians of {REPEATS}")


if __name__ == "__main__":
    main()
