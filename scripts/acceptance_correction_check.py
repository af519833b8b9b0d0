"""Synthetic drafts (0.8) at batch 32: the scheduler with the acceptance correction vs without it (acceptance_window=0)
vs plain, paired like `hf-dspark bench` (the "dflash" contender slot is reused for the uncorrected scheduler and
relabelled in the table). `OMP_NUM_THREADS=2 python scripts/acceptance_correction_check.py`"""
import torch
from hf_dspark import bench as B
from hf_dspark.modeling import DSparkDrafter
from hf_dspark.scheduler import AdaptiveVerification
from hf_dspark.targets import load_target
model, tok = load_target("smollm2-135m-instruct", dtype="float32")
drafter = DSparkDrafter.from_pretrained(str(B.default_drafter()), target=model)
sizes = [32]
pk = {"num_requests": (32,), "batch_tokens": [n for n in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256) if n <= 256],
      "context_len": 128, "repeats": 2, "warmup": 1}
bench = B.Bench(model, tok, drafter, None, 32, pk, 0.8)
orig = B.Bench.runner
def runner(self, c):
    if c == "dflash":  # stands in for "adaptive without the acceptance correction"
        policy = AdaptiveVerification(self.step_table(), carry_over=True, acceptance_window=0)
        return lambda enc: model.generate(**enc, max_new_tokens=32, do_sample=False, assistant_model=drafter, verify_policy=policy)
    return orig(self, c)
B.Bench.runner = runner
recs = bench.run("gsm8k", B.load_prompts("gsm8k", 64), 32, ["plain", "dspark_adaptive", "dflash"], 3)
print(B.markdown_table(recs).replace("dflash", "adaptive_no_rho"))
