"""Paired A/B of code variants on the demo prompts (tree 7, fp32, batch 1): variants are patch functions."""
import sys, time, statistics, contextlib
import torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "examples"))
import demo, hf_dspark
from hf_dspark.bench import default_drafter
from hf_dspark.targets import load_target
from hf_dspark import generation, draft_context
from hf_dspark.kernels import gather_kv

def old_reorder_tail(call, order, num_acc):
    for layer in call.cache.layers:
        w = order.shape[1]
        layer.keys = torch.cat([layer.keys[:, :, :-w], gather_kv(layer.keys[:, :, -w:], order)], dim=2)
        layer.values = torch.cat([layer.values[:, :, :-w], gather_kv(layer.values[:, :, -w:], order)], dim=2)
    call.context.reorder_tail(order, order.shape[1])

@contextlib.contextmanager
def variant(name):
    saved = generation._reorder_tail
    if name == "A":
        generation._reorder_tail = old_reorder_tail
    try:
        yield
    finally:
        generation._reorder_tail = saved

model, tok = load_target(demo.TARGET, dtype=torch.float32)
drafter = hf_dspark.DSparkDrafter.from_pretrained(default_drafter(), target=model)
opts = dict(adaptive_verification=False, draft_tree_size=7)
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
tot = {"plain": 0, "A": 0, "B": 0}
for name, prompt in demo.PROMPTS.items():
    enc = tok(demo.chat(tok, prompt), return_tensors="pt")
    kw = dict(max_new_tokens=64, do_sample=False)
    ref = model.generate(**enc, **kw)
    runs = {"plain": lambda: model.generate(**enc, **kw)}
    for v in ("A", "B"):
        def run(v=v):
            with variant(v):
                return model.generate(**enc, **kw, **opts, assistant_model=drafter)
        runs[v] = run
        assert torch.equal(run(), ref), v
    secs = {k: [] for k in runs}
    for i in range(reps):
        keys = list(runs)[i % 3:] + list(runs)[:i % 3]
        for k in keys:
            t0 = time.perf_counter(); runs[k](); secs[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in secs.items()}
    for k in med: tot[k] += med[k]
    ratio = statistics.median([a / b for a, b in zip(secs["A"], secs["B"])])
    print(f"{name}: plain {med['plain']:.2f}s A {med['plain']/med['A']:.3f}x B {med['plain']/med['B']:.3f}x  A/B paired {ratio:.3f}", flush=True)
print(f"overall: A {tot['plain']/tot['A']:.3f}x B {tot['plain']/tot['B']:.3f}x")
