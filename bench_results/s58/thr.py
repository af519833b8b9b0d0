import sys, time, statistics, torch
import hf_dspark
from hf_dspark import generation as G
from hf_dspark.bench import default_drafter
from hf_dspark.targets import load_target
sys.path.insert(0, "examples"); import demo
f = G._draft
def one_thread(*a, **k):
    torch.set_num_threads(1)
    try: return f(*a, **k)
    finally: torch.set_num_threads(2)
model, tok = load_target("smollm2-135m-instruct", dtype=torch.bfloat16)
drafter = hf_dspark.DSparkDrafter.from_pretrained(default_drafter(), target=model)
kw = dict(max_new_tokens=64, do_sample=False)
for name in ("math", "chat"):
    enc = tok.apply_chat_template([{"role": "user", "content": demo.PROMPTS[name]}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    T = {"2thr": [], "1thr-draft": []}
    for rep in range(6):
        for mode in T:
            G._draft = one_thread if mode == "1thr-draft" else f
            t = time.perf_counter(); model.generate(**enc, **kw, assistant_model=drafter); T[mode].append(time.perf_counter() - t)
            s = drafter.last_stats
            if rep == 5: print(name, mode, f"draft {1e3*s.draft_time_s/len(s.step_seconds):.2f} ms/step")
    print(name, {k: round(statistics.median(v[1:]), 3) for k, v in T.items()})
