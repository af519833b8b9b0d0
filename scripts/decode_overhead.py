"""Decode-only cost of plain steps through our loop (FixedLength(0), no drafter pass) vs generate(): 4 paired calls,
then a cProfile of the decode part of each. `OMP_NUM_THREADS=2 python scripts/decode_overhead.py 32` (batch size)."""
import cProfile, pstats, sys, time, torch
from hf_dspark.bench import Bench, default_drafter, load_prompts
from hf_dspark.modeling import DSparkDrafter
from hf_dspark.scheduler import FixedLength
from hf_dspark.targets import load_target
bs = int(sys.argv[1])
model, tok = load_target("smollm2-135m-instruct", dtype="float32")
drafter = DSparkDrafter.from_pretrained(str(default_drafter()), target=model)
bench = Bench(model, tok, drafter, max_new_tokens=32)
enc = bench.encode(load_prompts("gsm8k", bs))
kw = dict(max_new_tokens=32, do_sample=False)
plain = lambda: model.generate(**enc, **kw)
fixed0 = lambda: model.generate(**enc, **kw, assistant_model=drafter, verify_policy=FixedLength(0))
def timed(f):  # -> (time to first token, decode seconds)
    first = []
    h = model.register_forward_hook(lambda *_: first.append(time.perf_counter()) if not first else None)
    t0 = time.perf_counter()
    f()
    t1 = time.perf_counter(); h.remove()
    return first[0] - t0, t1 - first[0]
plain(); fixed0()
res = {"plain": [], "fixed0": []}
for i in range(4):
    for name, f in ([("plain", plain), ("fixed0", fixed0)] if i % 2 == 0 else [("fixed0", fixed0), ("plain", plain)]):
        res[name].append(timed(f))
for k, v in res.items():
    print(k, "ttft", [round(a, 2) for a, _ in v], "decode", [round(b, 2) for _, b in v])
print("decode ratio plain/fixed0 per pair", [round(a[1] / b[1], 3) for a, b in zip(res["plain"], res["fixed0"])])
for name, f in [("plain", plain), ("fixed0", fixed0)]:
    pr = cProfile.Profile()
    # profile only the decode part: start after the prefill
    first = []
    def hook(*_):
        if not first:
            first.append(1); pr.enable()
    h = model.register_forward_hook(hook)
    f(); pr.disable(); h.remove()
    print("=====", name)
    pstats.Stats(pr).sort_stats("tottime").print_stats(22)
