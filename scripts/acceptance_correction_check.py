"""Synthetic drafts (0.8) at batch 32: the scheduler with the acceptance correction vs without it (acceptance_window=0)
vs plain, paired like `hf-dspark bench`. `OMP_NUM_THREADS=2 python scripts/acceptance_correction_check.py`"""
from hf_dspark import bench as B
from hf_dspark.modeling import DSparkDrafter
from hf_dspark.scheduler import AdaptiveVerification
from hf_dspark.targets import load_target

model, tok = load_target("smollm2-135m-instruct", dtype="float32")
drafter = DSparkDrafter.from_pretrained(str(B.default_drafter()), target=model)
pk = {"num_requests": (32,), "batch_tokens": [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256],
      "context_len": 128, "repeats": 2, "warmup": 1}
no_rho = None


def adaptive_no_rho(enc):
    global no_rho
    if no_rho is None:  # one scheduler kept across calls, like the bench's dspark_adaptive
        no_rho = AdaptiveVerification(bench.step_table(), carry_over=True, acceptance_window=0)
    return model.generate(**enc, max_new_tokens=32, do_sample=False, assistant_model=drafter, verify_policy=no_rho)


bench = B.Bench(model, tok, drafter, None, 32, pk, 0.8, custom_runners={"adaptive_no_rho": adaptive_no_rho})
recs = bench.run("gsm8k", B.load_prompts("gsm8k", 64), 32, ["plain", "dspark_adaptive", "adaptive_no_rho"], 3)
print(B.markdown_table(recs))
