"""Drafter training cost per token: the training path of an earlier commit against the current one, side by side.

    OMP_NUM_THREADS=1 python scripts/training_throughput.py --data runs/data-sd [--legacy-commit a88490b] [--steps 4]
    python scripts/training_throughput.py --data runs/data-dom --legacy-commit 583ffd3 --threads 2 --batch-size 4 \
        --layers 2 --draft-vocab-size 16384            # the shipped drafter's shape and its training run's batch

Each contender runs in its own subprocess (`--threads`, default one), on the same sequences, with the same drafter
shape (`--layers`, default 1; Markov rank 64, block 7, 128 anchors per sequence, `--batch-size` sequences per step,
default one; bf16 target, bf16 autocast):
  legacy          the training step of `--legacy-commit` (a temporary git worktree): full-vocabulary lm_head over every
                  block slot, the paper's dense 0.1 CE + 0.9 L1 + 1.0 BCE, the target's forward every step;
  current         this tree: draft vocabulary of `--draft-vocab-size`, KL over the target's top-32 on the supervised
                  slots only, the target's forward every step;
  current-cached  the same with the target's taps and final states computed once beforehand (reused across epochs).
Reported: seconds per step (median of `--steps` after one warm-up step) and training tokens per second per core
(sequence tokens through a step), plus the ratios to legacy. Nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Runs inside the contender's tree (cwd): imports its own hf_dspark. Prints one JSON line.
WORKER = r"""
import json, statistics, sys, time, torch
from hf_dspark.targets import load_target
from hf_dspark.training import trainer as T
from hf_dspark.training.data import TokenDataset, target_hidden
from hf_dspark.training.losses import LossWeights
from hf_dspark.training.packing import pad_batch, sample_anchors
mode, data, steps, vocab_size, num_seqs, batch, layers = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:8])
torch.set_flush_denormal(mode != "legacy")  # as the current Trainer.run does
torch.manual_seed(0)
model, tok = load_target("smollm2-135m-instruct", dtype=torch.bfloat16)
ds = TokenDataset(data, model, tok)
seqs = [ds[i] for i in range(num_seqs)]
shape = dict(num_hidden_layers=layers, markov_rank=64, block_size=7)
head = None
if hasattr(T, "choose_draft_vocab"):
    ids, _ = T.choose_draft_vocab(ds, vocab_size, model.config.vocab_size, [model.generation_config.eos_token_id])
    drafter = T.build_drafter(model, tok, draft_token_ids=ids, **shape)
    head = T.target_head_rows(drafter, model)
    weights = LossWeights()
else:
    drafter = T.build_drafter(model, tok, **shape)
    weights = LossWeights()  # the legacy default: the paper's 0.1 CE + 0.9 L1 + 1.0 BCE
params = [p for p in drafter.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=1e-4)
gen = torch.Generator().manual_seed(0)
batches = []
for j in range(0, len(seqs), batch):
    group = seqs[j : j + batch]
    x, lm, _, anc = pad_batch(group, [sample_anchors(s[1], 128, gen) for s in group], 0)
    with torch.no_grad():
        feats = target_hidden(model, x, drafter.tap_hidden_state_ids) if mode == "current-cached" else None
    batches.append((x, lm, anc, feats, sum(len(s[0]) for s in group)))
times, tokens = [], []
for i in range(steps + 1):
    x, lm, anc, feats, n_tokens = batches[i % len(batches)]
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if head is not None:
            out = T.drafter_step_outputs(drafter, model, x, lm, anc, weights, feats, head)[0]
        else:
            out = T.drafter_step_outputs(drafter, model, x, lm, anc, weights, feats)[0]
    opt.zero_grad(set_to_none=True)
    out["loss"].backward()
    opt.step()
    if i:  # the first step warms up
        times.append(time.perf_counter() - t0)
        tokens.append(n_tokens)
print(json.dumps({"mode": mode, "step_s": statistics.median(times), "tokens_per_s": sum(tokens) / sum(times),
                  "params_dtype": str(params[0].dtype)}))
"""


def run(mode: str, tree: Path, args) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1", PYTHONPATH=str(tree))
    cmd = [sys.executable, "-c", WORKER, mode, str(Path(args.data).resolve()), str(args.steps), str(args.draft_vocab_size),
           str(max(args.sequences, args.batch_size)), str(args.batch_size), str(args.layers)]
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a make-data directory for SmolLM2-135M-Instruct")
    p.add_argument("--legacy-commit", default="a88490b", help="the commit whose training path is the baseline")
    p.add_argument("--steps", type=int, default=4, help="timed steps per contender (after one warm-up step)")
    p.add_argument("--sequences", type=int, default=4, help="distinct sequences cycled through")
    p.add_argument("--draft-vocab-size", type=int, default=8192)
    p.add_argument("--batch-size", type=int, default=1, help="sequences per step")
    p.add_argument("--layers", type=int, default=1, help="drafter decoder layers")
    p.add_argument("--threads", type=int, default=1, help="torch threads per contender (tokens/s/core divides by it)")
    p.add_argument("--out", default=None, help="also write the results as JSON")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        legacy = Path(tmp) / "legacy"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(legacy), args.legacy_commit], check=True,
                       capture_output=True)
        try:
            rows = [run("legacy", legacy, args), run("current", REPO, args), run("current-cached", REPO, args)]
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(legacy)], capture_output=True)
    base = rows[0]["tokens_per_s"]
    print(f"{'path':<16} {'s/step':>8} {'tokens/s/core':>14} {'vs legacy':>10}  master weights")
    for r in rows:
        r["speedup"], r["tokens_per_s"] = r["tokens_per_s"] / base, r["tokens_per_s"] / args.threads  # per core
        print(f"{r['mode']:<16} {r['step_s']:>8.2f} {r['tokens_per_s']:>14.1f} {r['speedup']:>9.1f}x  {r['params_dtype']}")
    if args.out:
        Path(args.out).write_text(json.dumps({"legacy_commit": args.legacy_commit, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
