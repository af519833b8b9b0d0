"""Greedy tau of draft trees of 7 under tree-shape variants (level penalty on node scores, top_k), fp32,
tuning prompts 40..51 of each eval set (not the 40 the card reports)."""
import sys, json, time, functools
import torch
from hf_dspark import DSparkDrafter, drafting, draft_tree
from hf_dspark.bench import default_drafter
from hf_dspark.targets import load_target
from hf_dspark.training.evaluate import measure, eval_prompts

model, tok = load_target("smollm2-135m-instruct", dtype=torch.float32)
drafter = DSparkDrafter.from_pretrained(default_drafter(), target=model)
sets = eval_prompts()
real_best, real_tree = draft_tree._best_nodes, drafting.draft_tree
lo, hi = int(sys.argv[2]), int(sys.argv[3])
for spec in sys.argv[1].split(","):
    lam, k, size = spec.split(":")
    lam, k, size = float(lam), int(k), int(size)
    draft_tree._best_nodes = lambda t, s, p, l, n, lam=lam: real_best(t, s - lam * l.to(s.dtype), p, l, n)
    drafting.grow_tree.__globals__["_best_nodes"] = draft_tree._best_nodes
    drafting.draft_tree = functools.partial(real_tree, top_k=k)
    res = {}
    t0 = time.time()
    for name in ("gsm8k", "humaneval", "mtbench"):
        res[name] = round(measure(drafter, model, tok, sets[name][lo:hi], max_new_tokens=128, draft_tree_size=size)["tau"], 3)
    print(json.dumps({"lambda": lam, "top_k": k, "size": size, **res, "sum": round(sum(res.values()), 3), "min": round((time.time()-t0)/60, 1)}), flush=True)
    drafting.draft_tree = real_tree
