"""Per-step cost of make-data's loop engine against plain generate() on a tiny random 30-layer target (the HF
forward's host overhead dominates), BATCH prompts of 20-60 tokens, 64 new tokens, no EOS; ms per decode step.

    OMP_NUM_THREADS=1 .venv/bin/python bench_results/s32/sd_loop_overhead.py [BATCH]

Session 32 (2-core EPYC): batch 8, ours 21.3 / 21.3 ms vs generate() 22.9 / 24.7; batch 256, ours 110.3 / 110.6 vs
103.5 / 110.5 (two passes each). The loop adds nothing to the forward's own cost, so the 2.2k tokens/s the H200 gave
at batch 256 is the HF forward's, not the loop's bookkeeping."""
import sys, time, torch
sys.path.insert(0, "tests")  # conftest.make_tiny_target
from conftest import make_tiny_target
from hf_dspark.training.data import GenerationSettings, generate_responses

torch.set_num_threads(1)
model = make_tiny_target(num_hidden_layers=30)
class Tok:  # what generate_responses reads
    pad_token_id = 0
model.generation_config.eos_token_id = None
R, N = int(sys.argv[1]) if len(sys.argv) > 1 else 256, 64
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(3, 250, (int(torch.randint(20, 60, (1,), generator=g)),), generator=g).tolist() for _ in range(R)]
for rep in range(2):
    t = time.perf_counter(); generate_responses(model, Tok(), prompts, GenerationSettings(batch_size=R, max_new_tokens=N)); ours = time.perf_counter() - t
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts]); att = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    t = time.perf_counter(); model.generate(input_ids=ids, attention_mask=att, max_new_tokens=N, min_new_tokens=N, do_sample=False, pad_token_id=0); plain = time.perf_counter() - t
    print(f"batch {R}: ours {1000 * ours / N:.1f} ms/step, plain generate {1000 * plain / N:.1f} ms/step")
