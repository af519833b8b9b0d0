"""How much would torch.compile take off a target forward on this CPU? One forward of q new tokens over a cached
prompt, SmolLM2 bf16: our eager path (linear layers prepacked, `hf_dspark.targets.load_target`) against
`torch.compile(model.forward, dynamic=True)` of the plain transformers model (inductor cannot trace the prepacked
layers), timed in turn, medians. A probe for a future compiled verify step, not a feature.

    OMP_NUM_THREADS=2 python bench_results/s43/compile_probe.py
"""
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import demo  # noqa: E402

from hf_dspark.targets import load_target  # noqa: E402

eager, tok = load_target(demo.TARGET, dtype=torch.bfloat16)
plain = AutoModelForCausalLM.from_pretrained(os.path.expanduser("~/.cache/hf_dspark/targets/smollm2-135m-instruct"),
                                             dtype=torch.bfloat16).eval()
compiled = torch.compile(plain.forward, dynamic=True)
ids = tok(demo.chat(tok, list(demo.PROMPTS.values())[0]), return_tensors="pt").input_ids
L = ids.shape[1]
caches = {}
for name, model in (("eager, prepacked", eager), ("compiled", plain)):
    caches[name] = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, past_key_values=caches[name], use_cache=True)
forwards = {"eager, prepacked": eager.forward, "compiled": compiled}


def step(name: str, q: int) -> float:
    x, pos = torch.randint(100, 1000, (1, q)), torch.arange(L, L + q)[None]
    t0 = time.perf_counter()
    with torch.no_grad():
        forwards[name](input_ids=x, position_ids=pos, past_key_values=caches[name], use_cache=True)
    seconds = time.perf_counter() - t0
    caches[name].crop(-q)
    return seconds


for q in (1, 12):
    t0 = time.perf_counter()
    for _ in range(3):  # compiles (once per new shape regime), then warms up
        step("compiled", q)
    print(f"q={q}: compile and warm-up {time.perf_counter() - t0:.0f} s")
    times = {name: [] for name in forwards}
    for _ in range(20):
        for name in forwards:
            times[name].append(step(name, q))
    med = {name: statistics.median(v) * 1000 for name, v in times.items()}
    print(f"q={q}: " + ", ".join(f"{name} {ms:.1f} ms" for name, ms in med.items())
          + f" (compiled / eager {med['compiled'] / med['eager, prepacked']:.2f})")
