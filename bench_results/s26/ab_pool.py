"""Session 26 (`HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2 python bench_results/s26/ab_pool.py 5`, from the repository root): A/B of StepCosts' pooled drafting line against per-depth means, in one process, contenders in turn: plain, full block,
scheduler (pooled), scheduler (per-depth, the previous pricing). Batch 1 on the demo's prompts (64 new tokens) and
batch 4 on 8 GSM8K prompts (32 new tokens), bf16, REPS timed runs each, medians. Quiet machine."""
import statistics, sys, time, torch, hf_dspark
sys.path.insert(0, "examples")
from demo import PROMPTS
from hf_dspark.bench import load_prompts
from hf_dspark.targets import load_target
REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
model, tok = load_target("smollm2-135m-instruct", dtype=torch.bfloat16)
d = hf_dspark.DSparkDrafter.from_pretrained("model_cards/dspark-smollm2-135m-instruct", target=model)
enc1 = {k: tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_tensors="pt", return_dict=True) for k, p in PROMPTS.items()}
tok.padding_side = "left"
g = load_prompts("gsm8k", 8)
texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True) for p in g]
enc4 = {f"gsm8k-b4-{i}": tok(texts[4 * i: 4 * i + 4], return_tensors="pt", padding=True) for i in range(2)}
model.generate(**enc1["math"], max_new_tokens=8, assistant_model=d, adaptive_verification=True)
pooled = d._dspark_scheduler
d._dspark_scheduler = None
model.generate(**enc1["math"], max_new_tokens=8, assistant_model=d, adaptive_verification=True)
percell = d._dspark_scheduler
percell[1].costs._pooled_drafting_line = lambda *a, **k: None
scheds = {"pooled": pooled, "percell": percell}
names = ["plain", "full", "pooled", "percell"]
def run(name, enc, n):
    kw = dict(max_new_tokens=n, do_sample=False)
    if name == "plain":
        return model.generate(**enc, **kw)
    if name == "full":
        return model.generate(**enc, **kw, assistant_model=d, adaptive_verification=False)
    d._dspark_scheduler = scheds[name]
    return model.generate(**enc, **kw, assistant_model=d, adaptive_verification=True)
for group, encs, n in (("batch 1", enc1, 64), ("batch 4", enc4, 32)):
    tot = {k: 0.0 for k in names}
    for label, enc in encs.items():
        for k in names: run(k, enc, n)
        ts = {k: [] for k in names}; steps = {k: [] for k in names}
        for r in range(REPS):
            for k in (names[r % 4:] + names[:r % 4]):
                t0 = time.perf_counter(); run(k, enc, n); ts[k].append(time.perf_counter() - t0)
                if k != "plain": steps[k].append(d.last_stats.steps)
        med = {k: statistics.median(v) for k, v in ts.items()}
        for k in names: tot[k] += med[k]
        print(group, label, " | ".join(f"{k} {med['plain']/med[k]:.2f}x ({statistics.median(steps[k])} steps)" for k in names[1:]), flush=True)
    print(group, "overall", " ".join(f"{k} {tot['plain']/tot[k]:.2f}x" for k in names[1:]), flush=True)
