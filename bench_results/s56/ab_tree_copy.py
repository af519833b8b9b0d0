"""A/B of the default tree with and without copies: per prompt, alternating, wall time and tokens per call."""
import statistics, sys, time, torch
import hf_dspark
from hf_dspark.targets import load_target
from hf_dspark.training.evaluate import eval_set, chat_inputs
model, tok = load_target("smollm2-135m-instruct", dtype=torch.bfloat16)
d = hf_dspark.DSparkDrafter.from_pretrained("model_cards/dspark-smollm2-135m-instruct", target=model)
name, n, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
prompts = eval_set(name, n)
encs = [chat_inputs(tok, [p]) for p in prompts]
model.generate(**encs[0], max_new_tokens=16, do_sample=False, assistant_model=d)
rows = []
for i, e in enumerate(encs):
    t = {0: [], 3: []}; st = {}
    for rep in range(2):
        for c in ((0, 3) if rep % 2 == 0 else (3, 0)):
            t0 = time.perf_counter()
            model.generate(**e, max_new_tokens=new, do_sample=False, assistant_model=d, copy_ngram=c)
            t[c].append(time.perf_counter() - t0)
            s = d.last_stats
            st[c] = (s.mean_accepted_length, len(s.step_seconds), statistics.median(s.step_seconds) * 1e3, s.draft_time_s / max(1, s.drafted_steps) * 1e3)
    a, b = min(t[0]), min(t[3])
    rows.append(a / b)
    print(f"{name}[{i}] no-copy {a:.2f}s tau {st[0][0]:.2f} steps {st[0][1]} step {st[0][2]:.1f}ms draft {st[0][3]:.1f}ms | copy {b:.2f}s tau {st[3][0]:.2f} steps {st[3][1]} step {st[3][2]:.1f}ms draft {st[3][3]:.1f}ms | speed ratio {a/b:.3f}")
print(f"{name}: median copy/no-copy speed {statistics.median(rows):.3f}, geomean {statistics.geometric_mean(rows):.3f}")
