"""Paired timing on eval prompts: plain vs tree 7 vs tree 7 + lookup, greedy, batch 1, fp32, 2 threads."""
import sys, time, statistics, torch
from hf_dspark import DSparkDrafter
from hf_dspark.bench import default_drafter
from hf_dspark.targets import load_target
from hf_dspark.training.evaluate import eval_set, chat_inputs
model, tok = load_target("smollm2-135m-instruct", dtype=torch.float32)
d = DSparkDrafter.from_pretrained(default_drafter(), target=model)
n, new, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cont = {"plain": {}, "tree7": dict(draft_tree_size=7), "tree7+L7": dict(draft_tree_size=7, prompt_lookup_num_tokens=7),
        "tree7+L10": dict(draft_tree_size=7, prompt_lookup_num_tokens=10)}
for name in ("gsm8k", "humaneval", "mtbench"):
    ratios = {k: [] for k in cont if k != "plain"}; taus = {k: [] for k in ratios}; tot = {k: 0.0 for k in cont}
    for p in eval_set(name, n):
        enc = chat_inputs(tok, [p])
        ref = model.generate(**enc, max_new_tokens=new, do_sample=False)
        for r in range(reps):
            t = {}
            for k, kw in cont.items():
                extra = dict(assistant_model=d, **kw) if kw else {}
                t0 = time.perf_counter(); out = model.generate(**enc, max_new_tokens=new, do_sample=False, **extra); t[k] = time.perf_counter() - t0
                assert torch.equal(out, ref), k
                if kw and r == 0: taus[k].append(d.last_stats.mean_accepted_length)
            for k in ratios: ratios[k].append(t["plain"] / t[k])
            for k in t: tot[k] += t[k]
    print(f"{name}: " + " | ".join(f"{k} median {statistics.median(ratios[k]):.2f}x, total {tot['plain']/tot[k]:.2f}x, tau {statistics.mean(taus[k]):.2f}" for k in ratios), flush=True)
