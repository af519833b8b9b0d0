"""Where a DSpark decode step's time goes, per contender, on `make demo`'s three prompts (greedy, 64 new tokens):
each of the loop's phases (hf_dspark.generation's _draft, _verify, _accept, _commit, ...) wrapped in a timer, the
contenders' calls interleaved over ROUNDS rounds after a warm-up.

    OMP_NUM_THREADS=2 python bench_results/s41/decode_phases.py 7,13,chain 3      # runs/s41: 'phases.py 7,13,0 3'
    OMP_NUM_THREADS=2 python bench_results/s41/decode_phases.py 7,7+7 2           # a tree of 7, with a lookup branch

A contender is `chain` (the full block) or a tree size N, optionally `+K` (a prompt-lookup branch of K tokens).
"""
import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import demo  # noqa: E402

import hf_dspark  # noqa: E402
import hf_dspark.generation as G  # noqa: E402
from hf_dspark.bench import default_drafter  # noqa: E402
from hf_dspark.targets import fast_dtype, load_target  # noqa: E402

PHASES = ["_decode_step", "_draft", "_draft_tree", "_verify", "_verify_tree", "_target_forward", "_accept",
          "_accept_tree", "_commit", "_trim", "_choose_depth", "_prefill"]
seconds, calls = collections.defaultdict(float), collections.Counter()  # per phase, reset per contender call


def timed_phase(name):
    real = getattr(G, name)

    def phase(*args, **kwargs):
        t0 = time.perf_counter()
        out = real(*args, **kwargs)
        seconds[name] += time.perf_counter() - t0
        calls[name] += 1
        return out

    setattr(G, name, phase)


def options(contender: str) -> dict:
    tree, _, lookup = contender.partition("+")
    return dict(adaptive_verification=False, draft_tree_size=None if tree == "chain" else int(tree),
                prompt_lookup_num_tokens=int(lookup) if lookup else None)


def main() -> None:
    contenders, rounds = sys.argv[1].split(","), int(sys.argv[2]) if len(sys.argv) > 2 else 3
    model, tok = load_target(demo.TARGET, dtype=fast_dtype())
    drafter = hf_dspark.DSparkDrafter.from_pretrained(default_drafter(), target=model)
    encs = [tok(demo.chat(tok, p), return_tensors="pt") for p in demo.PROMPTS.values()]
    for name in PHASES:
        timed_phase(name)

    def run(contender):
        for enc in encs:
            model.generate(**enc, max_new_tokens=64, do_sample=False, assistant_model=drafter, **options(contender))

    for c in contenders:  # warm-up
        run(c)
    totals = {c: [0.0, collections.defaultdict(float), collections.Counter()] for c in contenders}
    for _ in range(rounds):
        for c in contenders:
            seconds.clear()
            calls.clear()
            t0 = time.perf_counter()
            run(c)
            totals[c][0] += time.perf_counter() - t0
            for name in seconds:
                totals[c][1][name] += seconds[name]
                totals[c][2][name] += calls[name]
    for c, (total, sec, n) in totals.items():
        print(f"{c}: {total / rounds:.3f} s per {len(encs)} prompts")
        for name, s in sorted(sec.items(), key=lambda kv: -kv[1]):
            print(f"  {name:16s} {s / rounds * 1000:8.1f} ms {n[name] // rounds:5d} calls {s / n[name] * 1000:7.2f} ms/call")


if __name__ == "__main__":
    main()
