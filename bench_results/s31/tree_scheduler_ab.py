"""Paired: tree 7 (every step) vs tree sized by the scheduler vs the scheduler's chain, demo prompts, fp32, batch 1."""
# NOTE: the tree7+sched variant ran on a prototype that was not landed (main refuses draft_tree_size with adaptive_verification=True).
import sys, time, statistics
import torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "examples"))
import demo, hf_dspark
from hf_dspark.bench import default_drafter
from hf_dspark.targets import load_target
from hf_dspark.step_table import load_or_profile

model, tok = load_target(demo.TARGET, dtype=torch.float32)
drafter = hf_dspark.DSparkDrafter.from_pretrained(default_drafter(), target=model)
t0 = time.time()
load_or_profile(model, drafter_repo=None, target_id=str(model.name_or_path), profile_kwargs=demo.PROFILE)
print(f"table ready in {time.time()-t0:.0f} s", flush=True)
variants = {
    "tree7": dict(adaptive_verification=False, draft_tree_size=7),
    "tree7+sched": dict(adaptive_verification=True, draft_tree_size=7),
    "chain+sched": dict(adaptive_verification=True),
}
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
tot = {"plain": 0.0, **{k: 0.0 for k in variants}}
for name, prompt in demo.PROMPTS.items():
    enc = tok(demo.chat(tok, prompt), return_tensors="pt")
    kw = dict(max_new_tokens=64, do_sample=False)
    ref = model.generate(**enc, **kw)
    runs = {"plain": lambda: model.generate(**enc, **kw)}
    taus = {}
    for v, o in variants.items():
        runs[v] = lambda o=o: model.generate(**enc, **kw, **o, assistant_model=drafter)
        assert torch.equal(runs[v](), ref), v
        taus[v] = (drafter.last_stats.mean_accepted_length, drafter.last_stats.mean_verified_per_request, drafter.last_stats.drafted_steps, drafter.last_stats.steps)
    secs = {k: [] for k in runs}
    keys = list(runs)
    for i in range(reps):
        for k in keys[i % len(keys):] + keys[: i % len(keys)]:
            t0 = time.perf_counter(); runs[k](); secs[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in secs.items()}
    for k in med: tot[k] += med[k]
    print(f"{name}: plain {med['plain']:.2f}s | " + " | ".join(
        f"{v} {med['plain']/med[v]:.3f}x (tau {taus[v][0]:.2f}, verified {taus[v][1]:.2f}, drafted {taus[v][2]}/{taus[v][3]})" for v in variants), flush=True)
    print("   paired vs tree7: " + ", ".join(f"{v} {statistics.median([a/b for a,b in zip(secs['tree7'], secs[v])]):.3f}" for v in variants if v != 'tree7'), flush=True)
print("overall: " + " | ".join(f"{v} {tot['plain']/tot[v]:.3f}x" for v in variants))
