"""Held-out replayed tau of the two session-54 twins against training minutes and tokens (twin_learning_curve.png)."""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).parent
fig, (by_time, by_tokens) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
for arm, label in (("dspark", "DSpark (Markov rank 64 + confidence head)"), ("dflash", "DFlash twin (--dflash)")):
    rows = [r for r in json.loads((HERE / f"twin_{arm}_history.json").read_text()) if "eval_tau_replay" in r]
    by_time.plot([r["train_seconds"] / 60 for r in rows], [r["eval_tau_replay"] for r in rows], "o-", label=label)
    by_tokens.plot([r["tokens_seen"] / 1e6 for r in rows], [r["eval_tau_replay"] for r in rows], "o-", label=label)
by_time.set(xlabel="training minutes (one core each, side by side)", ylabel="held-out tau (replayed greedy)")
by_tokens.set(xlabel="training tokens (millions)")
by_time.legend()
for ax in (by_time, by_tokens):
    ax.grid(alpha=0.3)
fig.suptitle("Fresh 2-layer SmolLM2 drafters, same init, data, seed and minutes (session 54)")
fig.tight_layout()
fig.savefig(HERE / "twin_learning_curve.png", dpi=110)
