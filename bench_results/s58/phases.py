"""Wall time per phase of a tree step (wrapping functions), the demo's prompt, bf16, 2 threads."""
import collections, sys, time, torch
import hf_dspark
from hf_dspark import generation as G, drafting as Dr, draft_tree as DT, modeling as M, draft_context as DC
from hf_dspark.bench import default_drafter
from hf_dspark.targets import load_target
sys.path.insert(0, "examples"); import demo
acc = collections.defaultdict(float)
def wrap(mod, name, label=None):
    f = getattr(mod, name)
    def w(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[label or name] += time.perf_counter() - t; return r
    setattr(mod, name, w)
for n in ["_prefix_reader", "_choose_depth", "_draft", "_verify", "_accept", "_commit", "_target_forward", "tree_attention_mask", "ancestor_mask", "graft_branch", "_copy_index"]:
    if hasattr(G, n): wrap(G, n)
for n in ["_backbone", "grow_tree"]: wrap(Dr, n)
wrap(DC.DraftContext, "kv", "context.kv")
wrap(M.DSparkDrafter, "block_hidden"); wrap(M.DSparkDrafter, "base_logits")
model, tok = load_target("smollm2-135m-instruct", dtype=torch.bfloat16)
drafter = hf_dspark.DSparkDrafter.from_pretrained(default_drafter(), target=model)
enc = tok.apply_chat_template([{"role": "user", "content": demo.PROMPTS[sys.argv[1]]}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
kw = dict(max_new_tokens=64, do_sample=False)
for _ in range(2): model.generate(**enc, **kw, assistant_model=drafter)
acc.clear(); steps = 0; t = time.perf_counter()
for _ in range(5):
    model.generate(**enc, **kw, assistant_model=drafter); steps += len(drafter.last_stats.step_seconds)
total = time.perf_counter() - t
print(f"{sys.argv[1]}: {1e3*total/steps:.2f} ms per step over {steps} steps (incl prefill/setup)")
for k, v in sorted(acc.items(), key=lambda kv: -kv[1]): print(f"  {k:22s} {1e3*v/steps:6.2f} ms")
