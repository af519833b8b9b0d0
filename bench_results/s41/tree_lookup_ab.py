import sys, time, statistics, torch
sys.path.insert(0, "examples")
import demo, hf_dspark
from hf_dspark.bench import default_drafter
from hf_dspark.targets import load_target, fast_dtype
model, tok = load_target(demo.TARGET, dtype=fast_dtype())
drafter = hf_dspark.DSparkDrafter.from_pretrained(default_drafter(), target=model)
kw = dict(max_new_tokens=64, do_sample=False, adaptive_verification=False)
for label in sys.argv[1].split(","):
    enc = tok(demo.chat(tok, demo.PROMPTS[label]), return_tensors="pt")
    runs = {"plain": lambda: model.generate(**enc, max_new_tokens=64, do_sample=False),
            "7": lambda: model.generate(**enc, **kw, assistant_model=drafter, draft_tree_size=7),
            "7+7": lambda: model.generate(**enc, **kw, assistant_model=drafter, draft_tree_size=7, prompt_lookup_num_tokens=7),
            "11": lambda: model.generate(**enc, **kw, assistant_model=drafter, draft_tree_size=11),
            "11+7": lambda: model.generate(**enc, **kw, assistant_model=drafter, draft_tree_size=11, prompt_lookup_num_tokens=7)}
    steps = {}
    for k, r in runs.items():
        r()
        if k != "plain": steps[k] = (drafter.last_stats.steps, round(drafter.last_stats.mean_accepted_length, 2), sum(drafter.last_stats.verified_lengths))
    sec = {k: [] for k in runs}
    for _ in range(int(sys.argv[2])):
        for k, r in runs.items():
            t = time.perf_counter(); r(); sec[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in sec.items()}
    print(label, " | ".join(f"{k} {med['plain']/med[k]:.2f}x {med[k]*1000:.0f}ms {steps.get(k,'')}" for k in runs))
