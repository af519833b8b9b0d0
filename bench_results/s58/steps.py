"""Per-step split of a tree step against a plain step, the demo's prompts, bf16, 2 threads."""
import statistics, sys, time, torch
import hf_dspark
from hf_dspark.bench import default_drafter
from hf_dspark.targets import load_target
sys.path.insert(0, "examples")
import demo
model, tok = load_target("smollm2-135m-instruct", dtype=torch.bfloat16)
drafter = hf_dspark.DSparkDrafter.from_pretrained(default_drafter(), target=model)
fw = []
def pre(m, a, k): fw.append(time.perf_counter())
def post(m, a, k, o): fw[-1] = time.perf_counter() - fw[-1]
model.model.register_forward_pre_hook(pre, with_kwargs=True); model.model.register_forward_hook(post, with_kwargs=True)
opts = dict(max_new_tokens=64, do_sample=False)
extra = dict(a.split("=") for a in sys.argv[1:])
extra = {k: int(v) for k, v in extra.items()}
for name, prompt in demo.PROMPTS.items() if isinstance(demo.PROMPTS, dict) else demo.PROMPTS:
    enc = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    for rep in range(4):
        fw.clear(); t = time.perf_counter(); model.generate(**enc, **opts); tp = time.perf_counter() - t
        pf = fw[1:]
        fw.clear(); t = time.perf_counter(); model.generate(**enc, **opts, assistant_model=drafter, **extra); ts = time.perf_counter() - t
        s = drafter.last_stats; sf = fw[1:]
    n = len(s.step_seconds)
    print(f"{name}: plain {tp:.2f}s fwd med {1e3*statistics.median(pf):.1f}ms/{len(pf)}; spec {ts:.2f}s steps {n} tau {64/n:.2f} "
          f"step med {1e3*statistics.median(s.step_seconds):.1f}ms fwd med {1e3*statistics.median(sf):.1f}ms "
          f"draft {1e3*s.draft_time_s/n:.1f}ms verify {1e3*s.verify_time_s/n:.1f}ms policy {1e3*s.policy_time_s/n:.2f}ms tree {s.tree_size}")
