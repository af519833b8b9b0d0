"""Paired timing under sampling (T=0.7 and 1.0): plain generate() vs DSpark's chain (adaptive_verification=False)
vs the tree of 7 (the default for one prompt), demo prompts, fp32, batch 1, 64 new tokens; time per new token,
medians over seeds (each seed shared by the three contenders of a round)."""
import sys, time, statistics
import torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "examples"))
import demo, hf_dspark
from hf_dspark.bench import default_drafter
from hf_dspark.targets import load_target

model, tok = load_target(demo.TARGET, dtype=torch.float32)
drafter = hf_dspark.DSparkDrafter.from_pretrained(default_drafter(), target=model)
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
for temp in (0.7, 1.0):
    tot = {"plain": 0.0, "chain": 0.0, "tree7": 0.0}
    for name, prompt in demo.PROMPTS.items():
        enc = tok(demo.chat(tok, prompt), return_tensors="pt")
        kw = dict(max_new_tokens=64, do_sample=True, temperature=temp)
        runs = {
            "plain": lambda: model.generate(**enc, **kw),
            "chain": lambda: model.generate(**enc, **kw, assistant_model=drafter, adaptive_verification=False),
            "tree7": lambda: model.generate(**enc, **kw, assistant_model=drafter, draft_tree_size=7),
        }
        for r in runs.values():
            r()
        per_tok = {k: [] for k in runs}
        taus = {"chain": [], "tree7": []}
        keys = list(runs)
        for i in range(reps):
            for k in keys[i % 3:] + keys[: i % 3]:
                torch.manual_seed(1000 + i)
                t0 = time.perf_counter(); out = runs[k](); dt = time.perf_counter() - t0
                per_tok[k].append(dt / (out.shape[1] - enc["input_ids"].shape[1]))
                if k in taus:
                    taus[k].append(drafter.last_stats.mean_accepted_length)
        med = {k: statistics.median(v) for k, v in per_tok.items()}
        for k in med: tot[k] += med[k]
        print(f"T={temp} {name}: plain {med['plain']*1e3:.0f} ms/token | chain {med['plain']/med['chain']:.2f}x (tau {statistics.mean(taus['chain']):.2f}) | "
              f"tree7 {med['plain']/med['tree7']:.2f}x (tau {statistics.mean(taus['tree7']):.2f}) | paired chain/tree7 "
              f"{statistics.median([a/b for a, b in zip(per_tok['chain'], per_tok['tree7'])]):.3f}", flush=True)
    print(f"T={temp} overall (sum of per-token medians): chain {tot['plain']/tot['chain']:.2f}x, tree7 {tot['plain']/tot['tree7']:.2f}x", flush=True)
