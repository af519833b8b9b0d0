"""GPU check of the whole DSpark loop with the Triton kernels (no network, random models; ~1 minute on an H200).

    python scripts/gpu_generation_check.py --out report_dir

1. greedy exactness on CUDA (fp32): batch 1 and a ragged batch of 4, random drafter and near-perfect drafts
   (the reference continuation with one corrupted token), against plain `generate()`;
2. sampling exactness on CUDA: chi-square of the first three tokens on a 6-token vocabulary vs the exact joint;
3. per-step time split (draft / verify) of the loop on a larger random model in bf16 at batch 1, 16 and 64.
Writes report.json and prints a summary. Kernels are forced to Triton (HF_DSPARK_KERNELS=triton).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_DSPARK_KERNELS", "triton")
DEVICE = "cuda"

import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

import hf_dspark
from hf_dspark import DSparkConfig, DSparkDrafter
from hf_dspark.testing import oracle_drafts, ragged_batch


def tiny(vocab=4096, hidden=256, layers=8, dtype=torch.float32, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048, pad_token_id=0, **kw)
    return LlamaForCausalLM(cfg).to(DEVICE, dtype).eval()


def drafter_for(model, rank=32, seed=1):
    torch.manual_seed(seed)
    cfg = DSparkConfig.from_target(model.config, mask_token_id=model.config.vocab_size - 1, markov_rank=rank)
    return DSparkDrafter(cfg).to(DEVICE, model.dtype).eval().bind(model)


def ragged(vocab, lengths, seed=0):
    return ragged_batch(vocab, lengths, seed, device=DEVICE)


def greedy_checks() -> dict:
    model = tiny()
    drafter = drafter_for(model)
    out = {}
    for name, lengths in (("batch1", (9,)), ("ragged4", (5, 17, 3, 11))):
        enc = ragged(4096, lengths)
        ref = model.generate(**enc, max_new_tokens=64, do_sample=False, eos_token_id=None)
        plain_ok = torch.equal(model.generate(**enc, max_new_tokens=64, do_sample=False, eos_token_id=None, assistant_model=drafter), ref)
        with oracle_drafts(ref):
            oracle_ok = torch.equal(model.generate(**enc, max_new_tokens=64, do_sample=False, eos_token_id=None, assistant_model=drafter), ref)
        out[name] = {"random_drafter_identical": plain_ok, "oracle_drafts_identical": oracle_ok,
                     "tau_oracle": drafter.last_stats.mean_accepted_length}
    return out


def sampling_check(samples=6000) -> dict:
    v = 6
    model = tiny(vocab=v, hidden=64, layers=4, seed=7)
    drafter = drafter_for(model, rank=4, seed=8)
    prompt = torch.tensor([[1, 2, 3, 4]], device=DEVICE)
    warp = [TemperatureLogitsWarper(0.8), TopKLogitsWarper(4)]
    seqs = torch.tensor(list(itertools.product(range(v), repeat=3)), device=DEVICE)
    full = torch.cat([prompt.expand(seqs.shape[0], -1), seqs], 1)
    with torch.no_grad():
        logits = model(full).logits[:, 3:-1].float()
    logp = torch.zeros(seqs.shape[0], device=DEVICE)
    for k in range(3):
        s = logits[:, k]
        for w in warp:
            s = w(full, s)
        logp += torch.log_softmax(s, -1).gather(1, seqs[:, k : k + 1]).squeeze(1)
    probs = logp.exp().cpu()
    torch.manual_seed(1234)
    ids = prompt.expand(samples, -1).contiguous()
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=True,
                         temperature=0.8, top_k=4, eos_token_id=None, assistant_model=drafter)
    cells = (out[:, -3:].cpu() * torch.tensor([v * v, v, 1])).sum(1)
    counts = torch.bincount(cells, minlength=v**3).float()
    exp = probs * samples
    big = exp >= 5
    obs_b, exp_b = counts[big], exp[big]
    pvalue = float(chisquare(obs_b.numpy(), (exp_b * obs_b.sum() / exp_b.sum()).numpy()).pvalue)
    return {"chi_square_pvalue": pvalue, "accepted_tokens": drafter.last_stats.accepted_tokens, "pass": pvalue > 1e-3}


def timing() -> dict:
    model = tiny(vocab=32768, hidden=1024, layers=16, dtype=torch.bfloat16)
    drafter = drafter_for(model, rank=64)
    res = {}
    for bs in (1, 16, 64):
        enc = ragged(32768, [64] * bs, seed=bs)
        ref = model.generate(**enc, max_new_tokens=128, do_sample=False, eos_token_id=None)
        with oracle_drafts(ref):
            model.generate(**enc, max_new_tokens=16, do_sample=False, eos_token_id=None, assistant_model=drafter)
            sync()
            t0 = time.perf_counter()
            model.generate(**enc, max_new_tokens=128, do_sample=False, eos_token_id=None, assistant_model=drafter)
            sync()
            spec = time.perf_counter() - t0
        t0 = time.perf_counter()
        model.generate(**enc, max_new_tokens=128, do_sample=False, eos_token_id=None)
        sync()
        plain = time.perf_counter() - t0
        s = drafter.last_stats
        res[f"bs{bs}"] = {"plain_s": plain, "dspark_s": spec, "steps": s.steps, "tau_oracle": s.mean_accepted_length,
                          "draft_ms_per_step": 1000 * s.draft_time_s / s.steps, "verify_ms_per_step": 1000 * s.verify_time_s / s.steps}
    return res


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    global DEVICE
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "gpu_report"))
    p.add_argument("--device", default="cuda", help="cuda (the check) or cpu (a dry run of the script itself)")
    p.add_argument("--skip-timing", action="store_true")
    args = p.parse_args()
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("this check needs a CUDA GPU (use --device cpu for a dry run)")
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    report = {"device": name, "torch": torch.__version__, "greedy": greedy_checks(), "sampling": sampling_check()}
    if not args.skip_timing:
        report["timing"] = timing()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "generation_report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
