"""Resident memory of a CPU training run against its steps, with and without handing freed heap pages back.

    OMP_NUM_THREADS=1 python scripts/training_memory.py --data runs/data-m50 --steps 40

Each contender trains the same drafter (`--init`, default the shipped one) on the same batches in its own subprocess
(batch 4, 128 anchors, bf16 target, bf16 autocast, the trainer's losses):
  kept      glibc's heap keeps what the step freed (`trainer.release_freed_memory` switched off);
  released  the trainer's loop as it runs: `malloc_trim` after every step.
Reported: anonymous resident memory (RssAnon; the memory-mapped feature cache is file-backed and not counted) every
`--every` steps, and its growth per step over the second half of the run. glibc only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# One contender: prints one JSON line {"steps": [...], "rss_mb": [...]}.
WORKER = r"""
import json, sys, torch
from hf_dspark.modeling import DSparkDrafter
from hf_dspark.targets import load_target
from hf_dspark.training import trainer as T
from hf_dspark.training.data import TokenDataset
from hf_dspark.training.losses import LossWeights
mode, data, init, steps, every = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
if mode == "kept":
    T.release_freed_memory = lambda: None
model, tok = load_target("smollm2-135m-instruct", dtype=torch.bfloat16)
dataset = TokenDataset(data.split(","), model, tok)
drafter = DSparkDrafter.from_pretrained(init, target=model, dtype=torch.float32)
drafter.calibration = None
losses = LossWeights(ce=1.0, l1=0.0, bce=1.0, decay=4.0, kl=1.0, ce_label="target")
cfg = T.TrainConfig(data_dir=data, out_dir="unused", max_steps=10**6, batch_size=4, num_anchors=128, lr=1e-4,
                    bf16_autocast=True, eval_every=0, losses=losses)
trainer = T.Trainer(drafter, model, dataset, cfg, pad_id=tok.pad_token_id or 0, log=lambda *a: None)
torch.set_flush_denormal(True)

out = {"steps": [], "rss_mb": []}
for step in range(1, steps + 1):
    trainer.train_step()
    T.release_freed_memory()
    if step % every == 0:
        out["steps"].append(step)
        out["rss_mb"].append(round(T.anonymous_memory_mb()))
print(json.dumps(out))
"""


def growth_per_step(steps: list[int], rss: list[int]) -> float:
    """Least-squares slope of memory against step over the second half of the samples (MB per step)."""
    half = len(steps) // 2
    xs, ys = steps[half:], rss[half:]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="training data directories, comma-separated (make-data output)")
    p.add_argument("--init", default=str(REPO / "model_cards" / "dspark-smollm2-135m-instruct"), help="drafter to train")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=5, help="steps between memory readings")
    args = p.parse_args()
    if args.every < 1 or args.steps < 4 * args.every:
        p.error("--steps must cover at least four readings (4 x --every, --every >= 1): the growth is fitted over the "
                "second half of them")
    if not Path("/proc/self/status").is_file():
        p.error("this script reads /proc/self/status (Linux)")
    results = {}
    for mode in ("kept", "released"):
        run = subprocess.run([sys.executable, "-c", WORKER, mode, args.data, args.init, str(args.steps), str(args.every)],
                             cwd=REPO, capture_output=True, text=True)
        if run.returncode:
            sys.exit(f"{mode} failed:\n{run.stderr[-3000:]}")
        results[mode] = json.loads(run.stdout.strip().splitlines()[-1])
    steps = results["kept"]["steps"]
    print("step  " + "  ".join(f"{m:>12}" for m in results))
    for i, step in enumerate(steps):
        print(f"{step:>4}  " + "  ".join(f"{r['rss_mb'][i]:>9} MB" for r in results.values()))
    for mode, r in results.items():
        print(f"{mode}: {growth_per_step(r['steps'], r['rss_mb']):.1f} MB per step over steps {steps[len(steps) // 2]}-{steps[-1]}")


if __name__ == "__main__":
    main()
