"""What a drafting step after plain steps pays to catch up: projecting the drafter-context columns that the
prefill and the plain steps left (`DraftContext.kv()`: fc + norm + K/V of each drafter layer), for the shipped
drafter on SmolLM2, per request-column. Random taps of the right shape; median of 5 projections after a warm-up.

`OMP_NUM_THREADS=2 python scripts/catch_up_cost.py [dtype]` (default bfloat16)."""
import statistics
import sys
import time

import torch

from hf_dspark.bench import default_drafter
from hf_dspark.draft_context import DraftContext
from hf_dspark.modeling import DSparkDrafter
from hf_dspark.targets import load_target

dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
model, _ = load_target("smollm2-135m-instruct", dtype=dtype)
drafter = DSparkDrafter.from_pretrained(str(default_drafter()), target=model)
H, m = model.config.hidden_size, len(drafter.config.target_layer_ids)
for R, C in ((1, 200), (16, 180), (64, 180)):
    taps = [torch.randn(R, C, H, dtype=model.dtype) for _ in range(m)]  # m x [R, C, H]
    seconds = []
    with torch.no_grad():
        for _ in range(6):
            ctx = DraftContext(drafter)
            ctx.append(taps, torch.arange(C).expand(R, C))
            t0 = time.perf_counter()
            ctx.kv()
            seconds.append(time.perf_counter() - t0)
    s = statistics.median(seconds[1:])
    print(f"R={R:3d} C={C}: {1e3 * s:7.1f} ms, {1e6 * s / (R * C):5.2f} us per request-column")
