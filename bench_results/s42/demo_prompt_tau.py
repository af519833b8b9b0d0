"""tau on make demo's 3 prompts (64 tokens, bf16 greedy) for tree 11 with/without lookup at several prior rates."""
# OMP_NUM_THREADS=1 python bench_results/s42/demo_prompt_tau.py 11   (from the repository root)
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import demo, hf_dspark, torch
import hf_dspark.prompt_lookup as pl
from hf_dspark.bench import default_drafter
from hf_dspark.targets import load_target, fast_dtype
model, tok = load_target(demo.TARGET, dtype=fast_dtype())
d = hf_dspark.DSparkDrafter.from_pretrained(default_drafter(), target=model)
size = int(sys.argv[1]) if len(sys.argv) > 1 else 11
for rate in [None, 0.7, 0.5, 0.3, 0.2]:
    taus = []
    for label, prompt in demo.PROMPTS.items():
        enc = tok(demo.chat(tok, prompt), return_tensors="pt")
        kw = dict(prompt_lookup_num_tokens=0) if rate is None else {}
        if rate is not None: pl.PRIOR_RATE = rate
        model.generate(**enc, max_new_tokens=64, do_sample=False, assistant_model=d, draft_tree_size=size, **kw)
        taus.append(round(d.last_stats.mean_accepted_length, 2))
    print(size, "no lookup" if rate is None else f"prior {rate}", taus, round(sum(taus), 2), flush=True)
