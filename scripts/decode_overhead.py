"""Decode-only cost of plain steps through our loop (FixedLength(0), no drafter pass) vs generate(): 4 paired calls
timed by `hf_dspark.bench.Bench` (decode speedup = prefill taken out), then the time per decode step spent inside
and outside the target's forward (forward hooks; the inside part is the same forward for both, so its difference
is this machine's noise unless our inputs slow it down), and a cProfile of the decode part.
`OMP_NUM_THREADS=2 python scripts/decode_overhead.py 32` (batch size)."""
import cProfile
import pstats
import sys
import time

from hf_dspark.bench import Bench, decode_seconds, default_drafter, load_prompts, markdown_table
from hf_dspark.modeling import DSparkDrafter
from hf_dspark.scheduler import FixedLength
from hf_dspark.targets import load_target

bs = int(sys.argv[1])
model, tok = load_target("smollm2-135m-instruct", dtype="float32")
drafter = DSparkDrafter.from_pretrained(str(default_drafter()), target=model)
kw = dict(max_new_tokens=32, do_sample=False)
loop_plain = lambda enc: model.generate(**enc, **kw, assistant_model=drafter, verify_policy=FixedLength(0))  # noqa: E731
bench = Bench(model, tok, drafter, max_new_tokens=32, custom_runners={"loop_plain_steps": loop_plain})
plain, loop = bench.run("gsm8k", load_prompts("gsm8k", bs), bs, ["plain", "loop_plain_steps"], repeats=4)
print(markdown_table([plain, loop]))
print("decode ratio per pair (plain / loop):", [round(a[0] / b[0], 3) for a, b in zip(decode_seconds(plain), decode_seconds(loop))])

enc = bench.encode(load_prompts("gsm8k", bs))
for name, run in [("plain", bench.runner("plain")), ("loop_plain_steps", loop_plain)] * 2:  # inside / outside the forwards
    spans = []  # [start, end] of each target forward; the first is the prefill
    pre = model.register_forward_pre_hook(lambda *_: spans.append([time.perf_counter(), None]))
    post = model.register_forward_hook(lambda *_: spans[-1].__setitem__(1, time.perf_counter()))
    run(enc)
    end = time.perf_counter()
    pre.remove(), post.remove()
    inside = sum(e - s for s, e in spans[1:])
    outside = end - spans[0][1] - inside
    steps = len(spans) - 1
    print(f"{name}: per decode step {1000 * inside / steps:.0f} ms in the target's forward, {1000 * outside / steps:.1f} ms outside")
for name, run in [("plain", bench.runner("plain")), ("loop_plain_steps", loop_plain)]:
    profiler, started = cProfile.Profile(), []

    def start_after_prefill(*_):  # profile only the decode part
        if not started:
            started.append(1)
            profiler.enable()

    hook = model.register_forward_hook(start_after_prefill)
    run(enc)
    profiler.disable()
    hook.remove()
    print("=====", name)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(22)
