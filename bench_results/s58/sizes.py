import sys, time, statistics, torch, random
import hf_dspark
from hf_dspark.bench import default_drafter
from hf_dspark.targets import load_target
sys.path.insert(0, "examples"); import demo
model, tok = load_target("smollm2-135m-instruct", dtype=torch.bfloat16)
drafter = hf_dspark.DSparkDrafter.from_pretrained(default_drafter(), target=model)
kw = dict(max_new_tokens=64, do_sample=False)
sizes = [int(x) for x in sys.argv[1].split(",")]
tot = {s: 0.0 for s in ["plain"] + sizes}
for name, prompt in demo.PROMPTS.items():
    enc = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    T = {s: [] for s in ["plain"] + sizes}; tau = {}
    for rep in range(6):
        for s in T:
            o = {} if s == "plain" else dict(assistant_model=drafter, draft_tree_size=s)
            t = time.perf_counter(); model.generate(**enc, **kw, **o); T[s].append(time.perf_counter() - t)
            if s != "plain": tau[s] = 64 / len(drafter.last_stats.step_seconds)
    med = {s: statistics.median(v[1:]) for s, v in T.items()}
    for s in T: tot[s] += med[s]
    print(name, " ".join(f"{s}: {med['plain']/med[s]:.2f}x" + (f" (tau {tau[s]:.2f})" if s in tau else "") for s in sizes))
print("overall", " ".join(f"{s}: {tot['plain']/tot[s]:.3f}x" for s in sizes))
