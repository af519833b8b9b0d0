"""Our decoding loop at an older commit against the working tree's, in one process, on the same target and weights.

The older commit's `hf_dspark` (and its kernels) is unpacked under a temporary name (`hf_dspark_old`; the package
imports itself relatively), both loops run through `generate(custom_generate=...)` with the same explicit tree, and
the calls are timed in turn (the order flips every round) after a warm-up: medians per prompt and paired per-call
ratios old / new, plus plain `generate()` for the speedups. The texts must match (same tree, same forwards); with
--temperature every call samples (torch seeded per call) and the texts are not compared.

    OMP_NUM_THREADS=2 python bench_results/s44/loop_ab.py --old c7b6ca4 --rounds 7
    OMP_NUM_THREADS=2 python bench_results/s44/loop_ab.py --old c7b6ca4 --rounds 5 --sets gsm8k,humaneval,mtbench --batch 4 --tree-size 7
    OMP_NUM_THREADS=2 python bench_results/s44/loop_ab.py --old b51c2c8 --rounds 4 --temperature 0.7   # session 45
    OMP_NUM_THREADS=2 python bench_results/s44/loop_ab.py --old 4490f60 --generate-kwargs '{"min_new_tokens": 16}'  # 46
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))


def unpack_old(rev: str, where: Path) -> None:
    """`hf_dspark` and `kernels` at `rev` -> where/hf_dspark_old (kernels as its subpackage, as pyproject maps it)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "hf_dspark", "kernels"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    (where / "hf_dspark").rename(where / "hf_dspark_old")
    (where / "kernels").rename(where / "hf_dspark_old" / "kernels")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the commit whose loop to compare against")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--tree-size", type=int, default=11, help="draft_tree_size for both (with its lookup branch)")
    parser.add_argument("--sets", default=None, help="prompt sets (gsm8k,humaneval,mtbench), one call of --batch prompts each; default: the demo's prompts, one at a time")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=0.0, help="> 0: sample at this temperature")
    parser.add_argument("--generate-kwargs", type=json.loads, default={},
                        help='more generate() arguments for every contender, as JSON: \'{"repetition_penalty": 1.1}\'')
    args = parser.parse_args()

    import demo
    import hf_dspark
    from hf_dspark.bench import default_drafter, load_prompts
    from hf_dspark.targets import fast_dtype, load_target

    tmp = Path(tempfile.mkdtemp())
    unpack_old(args.old, tmp)
    sys.path.insert(0, str(tmp))
    old_pkg = importlib.import_module("hf_dspark_old")
    old_pkg.prepack.PrepackedLinear = hf_dspark.prepack.PrepackedLinear  # one class: the old loop sees the target prepacked

    model, tok = load_target(demo.TARGET, dtype=fast_dtype())
    drafters = {
        "new": (hf_dspark, hf_dspark.DSparkDrafter.from_pretrained(default_drafter(), target=model)),
        "old": (old_pkg, old_pkg.DSparkDrafter.from_pretrained(default_drafter(), target=model)),
    }
    hf_dspark.prepack_linears(drafters["old"][1])
    generate = type(model).generate
    runs = {}
    tok.padding_side = "left"
    prompts = demo.PROMPTS if args.sets is None else {s: load_prompts(s, args.batch) for s in args.sets.split(",")}
    for label, prompt in prompts.items():
        texts = [demo.chat(tok, p) for p in ([prompt] if isinstance(prompt, str) else prompt)]
        enc = tok(texts, return_tensors="pt", padding=True)
        kw = dict(max_new_tokens=args.max_new_tokens, do_sample=args.temperature > 0, **args.generate_kwargs)
        if args.temperature > 0:
            kw["temperature"] = args.temperature
        calls = {"plain": lambda enc=enc, kw=kw: generate(model, **enc, **kw)}
        for name, (pkg, drafter) in drafters.items():
            calls[name] = lambda enc=enc, kw=kw, pkg=pkg, d=drafter: generate(
                model, **enc, **kw, custom_generate=pkg.generate, drafter=d, draft_tree_size=args.tree_size)
        outs = {name: call() for name, call in calls.items()}
        tau = drafters["new"][1].last_stats.mean_accepted_length
        same = "sampled" if args.temperature > 0 else torch.equal(outs["old"], outs["new"])
        print(f"{label}: same text old / new: {same}, tau {tau:.2f}")
        runs[label] = calls
    times = {label: {name: [] for name in calls} for label, calls in runs.items()}
    for r in range(args.rounds):
        for label, calls in runs.items():
            for name in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
                torch.manual_seed(r)
                start = time.perf_counter()
                calls[name]()
                times[label][name].append(time.perf_counter() - start)
    totals = dict.fromkeys(("plain", "old", "new"), 0.0)
    for label, t in times.items():
        med = {name: statistics.median(v) for name, v in t.items()}
        for name in totals:
            totals[name] += med[name]
        paired = statistics.median(o / n for o, n in zip(t["old"], t["new"]))
        print(f"{label}: plain {med['plain']:.3f} s, old {med['old']:.3f} s ({med['plain'] / med['old']:.2f}x), "
              f"new {med['new']:.3f} s ({med['plain'] / med['new']:.2f}x); paired old / new time {paired:.3f}")
    print(f"overall: old {totals['plain'] / totals['old']:.2f}x, new {totals['plain'] / totals['new']:.2f}x of plain "
          f"generate(); old / new time {totals['old'] / totals['new']:.3f} ({torch.get_num_threads()} threads, "
          f"{args.rounds} rounds, tree of {args.tree_size}, {args.batch} prompt(s) per call)")


if __name__ == "__main__":
    main()
