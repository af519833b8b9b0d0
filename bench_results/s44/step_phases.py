"""Where a tree step's time goes: wall time of the decoding loop's parts, per step, greedy, 64 new tokens, 3 passes
after a warm-up. The parts nest (the draft holds the backbone and the tree's growth, the verify the target's
forward), so the rows do not add up.

    OMP_NUM_THREADS=2 python bench_results/s44/step_phases.py                          # the demo's prompts, one at a time
    OMP_NUM_THREADS=2 python bench_results/s44/step_phases.py --prompts mtbench --batch 8 --tree-size 7
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import demo  # noqa: E402

import hf_dspark  # noqa: E402
import hf_dspark.draft_context as draft_context  # noqa: E402
import hf_dspark.drafting as drafting  # noqa: E402
import hf_dspark.generation as generation  # noqa: E402
from hf_dspark.bench import default_drafter, load_prompts  # noqa: E402
from hf_dspark.targets import fast_dtype, load_target  # noqa: E402

totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])  # label -> [seconds, calls]


def timed(owner, name: str, label: str | None = None) -> None:
    """Replace owner.name by a wrapper that adds its wall time and call count to totals[label or name]."""
    real, entry = getattr(owner, name), totals[label or name]

    @functools.wraps(real)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            entry[0] += time.perf_counter() - start
            entry[1] += 1

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", default=None, help="gsm8k | humaneval | mtbench (default: the demo's three, one by one)")
    parser.add_argument("--batch", type=int, default=1, help="prompts per call (with --prompts)")
    parser.add_argument("--tree-size", type=int, default=None, help="draft_tree_size (default: what a call gets)")
    args = parser.parse_args()
    model, tok = load_target(demo.TARGET, dtype=fast_dtype())
    drafter = hf_dspark.DSparkDrafter.from_pretrained(default_drafter(), target=model)
    for name in ("_decode_step", "_draft", "_verify", "_target_forward", "_accept", "_commit", "_reorder_tail", "_trim",
                 "accept_tree", "ancestor_mask", "graft_branch"):
        timed(generation, name)
    for name in ("_backbone", "grow_tree"):
        timed(drafting, name)
    timed(draft_context.DraftContext, "kv", "context projection (DraftContext.kv)")
    for name in ("block_hidden", "base_logits", "markov_bias"):
        timed(type(drafter), name)
    if args.prompts is None:
        encs = [tok(demo.chat(tok, p), return_tensors="pt") for p in demo.PROMPTS.values()]
    else:
        tok.padding_side = "left"
        texts = [demo.chat(tok, p) for p in load_prompts(args.prompts, args.batch)]
        encs = [tok(texts, return_tensors="pt", padding=True)]
    kw = dict(max_new_tokens=64, do_sample=False, assistant_model=drafter)
    if args.tree_size is not None:
        kw["draft_tree_size"] = args.tree_size
    for enc in encs:  # warm-up
        model.generate(**enc, **kw)
    for entry in totals.values():
        entry[:] = [0.0, 0]
    for _ in range(3):
        for enc in encs:
            model.generate(**enc, **kw)
    steps = totals["_decode_step"][1]
    print(f"{steps} steps, tree of {drafter.last_stats.tree_size}")
    for label, (total, count) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
        print(f"{label:40s} {total / steps * 1000:6.2f} ms per step ({count / steps:.2f} calls per step)")


if __name__ == "__main__":
    main()
