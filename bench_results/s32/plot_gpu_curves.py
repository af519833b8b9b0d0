"""Held-out teacher-forced tau against training tokens for the session-32 H200 runs (gpu_run*_history.json).

    .venv/bin/python bench_results/s32/plot_gpu_curves.py   -> bench_results/s32/gpu_learning_curves.png
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

here = Path(__file__).parent
curves = dict(json.loads((here / "gpu_run1_history.json").read_text()))
curves["continued (shipped drafter + ShareGPT as written)"] = json.loads((here / "gpu_run2_history.json").read_text())
labels = {"fresh": "fresh DSpark (run 1)", "dflash": "fresh DFlash twin (run 1)"}
fig, ax = plt.subplots(figsize=(7, 4))
for name, hist in curves.items():
    pts = [(e["tokens_seen"] / 1e6, e["eval_tau_tf"]) for e in hist if e.get("eval_tau_tf") is not None]
    ax.plot(*zip(*pts), marker="o", label=labels.get(name, name))
ax.set_xlabel("training tokens (millions)")
ax.set_ylabel("held-out teacher-forced tau")
# --eval-sequences 8 holds out the data's last 8 sequences: run 1's are self-distilled answers, run 2's (no
# self-distilled data) ShareGPT conversations as written, so the green curve is on another held-out set
fig.text(0.01, 0.01, "held out: run 1, its last 8 self-distilled answers; run 2, its last 8 ShareGPT conversations",
         fontsize=7, color="0.4")
ax.set_title("H200: run 1, 4 min, two processes sharing the GPU; run 2, 93 s alone")
ax.grid(alpha=0.3)
ax.legend()
fig.tight_layout(rect=(0, 0.03, 1, 1))
fig.savefig(here / "gpu_learning_curves.png", dpi=120)
print(f"wrote {here / 'gpu_learning_curves.png'}")
