"""Which draft tree size pays on this machine: plain `generate()`, DSpark's chain and draft trees of several sizes,
with or without a prompt-lookup branch, on `make demo`'s three prompts (or prompts of the eval sets), greedy, batch 1,
after a warm-up timed in turn (medians), in one process.

    OMP_NUM_THREADS=2 python scripts/draft_tree_sizes.py --sizes chain,7+0,7,11,16 --repeats 5
    OMP_NUM_THREADS=2 python scripts/draft_tree_sizes.py --sizes 7,10,13 --prompts gsm8k,humaneval,mtbench --n 4 --start 40

A size is `chain` or a tree size N, optionally `+K` (`prompt_lookup_num_tokens=K`). A tree of N verifies N drafts
per step, a prompt-lookup branch of up to N tokens among them (as `generate()` does by default); `N+K` caps that
branch at K tokens and `N+0` verifies the drafter's nodes alone. `chain+K` grafts a branch of K onto the chain.

Prints per prompt and overall the speedup against plain `generate()` in seconds per new token (a bf16 text that leaves
plain generate()'s may stop at another length) and tau of each contender; a larger tree accepts
more per step but every verify step scores more tokens, so the best size depends on how a forward's cost grows with
its width on the device (`hf-dspark profile` shows that curve).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import demo  # noqa: E402  (the demo's prompts and chat template)

import hf_dspark  # noqa: E402
from hf_dspark.bench import default_drafter, load_prompts  # noqa: E402
from hf_dspark.targets import fast_dtype, load_target  # noqa: E402


def parse_size(text: str) -> tuple[int | None, int | None]:
    """'chain' | 'N' | 'chain+K' | 'N+K' -> (draft_tree_size, prompt_lookup_num_tokens)."""
    tree, _, lookup = text.strip().partition("+")
    return (None if tree == "chain" else int(tree)), (int(lookup) if lookup else None)


def label(size: tuple[int | None, int | None]) -> str:
    """(draft_tree_size, prompt_lookup_num_tokens) -> how the tables name it."""
    tree, lookup = size
    if tree is None:
        return "chain" + (f" + lookup {lookup}" if lookup else "")
    return f"tree {tree}" + {None: "", 0: " (no lookup)"}.get(lookup, f" (lookup {lookup})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="chain,7+0,7,11", help="comma list: 'chain' (the full block) or tree sizes N "
                   "(with a prompt-lookup branch among the N drafts), each optionally +K (a branch of at most K "
                   "tokens; +0: none)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per contender and prompt, taken in turn")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    p.add_argument("--prompts", default="demo", help="'demo' (make demo's three prompts) or a comma list of eval sets "
                   "(gsm8k, humaneval, mtbench)")
    p.add_argument("--n", type=int, default=4, help="prompts per eval set")
    p.add_argument("--start", type=int, default=40, help="the first prompt of each eval set (default 40: past the "
                   "40 prompts the model card's tau is measured on)")
    args = p.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    dtype = fast_dtype() if args.dtype == "auto" else getattr(torch, args.dtype)
    model, tok = load_target(demo.TARGET, dtype=dtype)
    drafter = hf_dspark.DSparkDrafter.from_pretrained(default_drafter(), target=model)
    seconds = {"plain": 0.0, **{label(s): 0.0 for s in sizes}}  # summed over the prompts
    tokens = dict.fromkeys(seconds, 0)  # new tokens, summed over the prompts
    print(f"{torch.get_num_threads()} threads, {str(dtype).removeprefix('torch.')}, greedy, batch 1, "
          f"{args.max_new_tokens} new tokens, medians of {args.repeats} runs")
    for name, prompt in prompts(args):
        enc = tok(demo.chat(tok, prompt), return_tensors="pt")
        kw = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
        runs = {"plain": lambda: model.generate(**enc, **kw)}
        for s in sizes:
            runs[label(s)] = lambda s=s: model.generate(**enc, **kw, assistant_model=drafter, adaptive_verification=False,
                                                        draft_tree_size=s[0], prompt_lookup_num_tokens=s[1])
        taus, new = {}, {}
        for key, run in runs.items():  # warm-up; the text and tau are deterministic (greedy)
            new[key] = run().shape[1] - enc["input_ids"].shape[1]
            if key != "plain":
                taus[key] = drafter.last_stats.mean_accepted_length
        med = demo.medians_in_turn(runs, args.repeats)
        for key in med:
            seconds[key] += med[key]
            tokens[key] += new[key]
        per_token = {key: med[key] / new[key] for key in med}
        print(f"{name:12s} plain {med['plain']:.2f} s | " + " | ".join(
            f"{key} {per_token['plain'] / per_token[key]:.2f}x (tau {taus[key]:.2f})" for key in taus))
    rate = {key: seconds[key] / tokens[key] for key in seconds}  # seconds per new token over all prompts
    print("overall " + " | ".join(f"{key} {rate['plain'] / rate[key]:.2f}x" for key in rate if key != "plain"))
    return 0


def prompts(args) -> list[tuple[str, str]]:
    """(name, prompt) pairs: the demo's, or prompts start..start+n-1 of each named eval set."""
    if args.prompts == "demo":
        return list(demo.PROMPTS.items())
    pairs = []
    for name in args.prompts.split(","):
        chosen = load_prompts(name, args.start + args.n)[args.start :]
        pairs += [(f"{name} {args.start + i}", text) for i, text in enumerate(chosen)]
    return pairs


if __name__ == "__main__":
    sys.exit(main())
