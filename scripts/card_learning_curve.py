"""Grow and redraw the model card's learning curve across sessions.

The card keeps every held-out evaluation of every run in `learning_curve.json` (cumulative steps, training tokens
and CPU-hours) and draws it as `learning_curve.png`, one line per run. A run resumed from the last one adds its
`history.json` with `--append`:

    python scripts/card_learning_curve.py --card model_cards/dspark-smollm2-135m-instruct \
        --append runs/train-j/history.json --session 20 --run j --cores 2 \
        --label "held-out: 26 new ShareGPT answers; fresh data only"

Without `--append` it only redraws the figure from the JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from hf_dspark.io_utils import atomic_path, write_json_atomic

# Legends of the sessions before labels were stored with the points.
OLD_LABELS = {
    13: "held-out: self-distilled ShareGPT answers",
    14: "held-out: self-distilled math/code answers",
    15: "same held-out as session 14",
    16: "held-out: new self-distilled ShareGPT answers",
    17: "same held-out as session 16; cached self-distilled sets, lr 3e-4",
    18: "same held-out; + self-distilled stories and code tasks",
    19: "held-out: new ShareGPT answers; + 3,200 self-distilled ShareGPT prompts, lr 2e-4",
}


def trained_seconds(history: list[dict]) -> float:
    """A run's training seconds: its history's last (largest) reading."""
    return max((h["train_seconds"] for h in history), default=0.0)


def append_run(points: list[dict], history: list[dict], session: int, run: str, cores: int, label: str,
               heldout: str | None, gpu: bool = False, soup_seconds: float = 0.0) -> list[dict]:
    """The run's evaluations, counted on from the last point (its step, tokens and CPU-hours start at 0). A run on a
    GPU (`gpu`) adds its seconds to `gpu_seconds` instead of CPU-hours. `soup_seconds`: the training seconds of the
    other runs whose weights were averaged with this one's (a weight soup); they count in the CPU-hours in proportion
    to the run's own seconds, so its last point holds them all, and its steps and tokens stay its own."""
    if any((p["session"], p.get("run")) == (session, run) for p in points):
        raise SystemExit(f"session {session}'s run {run} is already in the curve; pick the next session or run.")
    last = points[-1]
    own = trained_seconds(history)
    scale = (own + soup_seconds) / own if own > 0 else 1.0  # CPU-seconds of the soup per second of this run
    new = []
    for h in history:
        if "eval_tau_tf" not in h:
            continue
        new.append({
            "session": session,
            "run": run,
            "step": last["step"] + h["step"],
            "tokens_seen": last["tokens_seen"] + h["tokens_seen"],
            "train_seconds": h["train_seconds"],
            "eval_tau_tf": h["eval_tau_tf"],
            "cpu_hours": round(last["cpu_hours"] + (0 if gpu else h["train_seconds"] * scale * cores / 3600), 3),
            "gpu_seconds": round(last.get("gpu_seconds", 0) + (h["train_seconds"] if gpu else 0), 1),
            "label": label,
            **({"heldout": heldout} if heldout else {}),
        })
    if not new:
        raise SystemExit("the history has no held-out evaluation (eval_tau_tf); nothing to add.")
    return points + new


def draw(points: list[dict], path: Path, title: str) -> None:
    """One line per run: held-out teacher-forced tau against cumulative training tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 6.0))
    for (session, run), group in itertools.groupby(points, key=lambda p: (p["session"], p.get("run"))):
        group = list(group)
        label = group[-1].get("label") or OLD_LABELS.get(session, "")
        ax.plot([p["tokens_seen"] / 1e6 for p in group], [p["eval_tau_tf"] for p in group], ".-",
                label=f"session {session}, run {run} ({label})")
    ax.set_xlabel("cumulative training tokens (millions)")
    ax.set_ylabel("held-out tau, teacher-forced greedy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1, frameon=False)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight")  # the legend below the axes, whole
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--card", type=Path, required=True, help="model card folder with learning_curve.json")
    ap.add_argument("--append", type=Path, default=None, help="a run's history.json to add after the last run")
    ap.add_argument("--session", type=int, default=None)
    ap.add_argument("--run", default=None, help="the run's letter, as in the card's commands")
    ap.add_argument("--cores", type=int, default=2, help="cores the run trained on (CPU-hours = seconds x cores)")
    ap.add_argument("--gpu", action="store_true", help="the run trained on a GPU: its seconds count as GPU-seconds")
    ap.add_argument("--label", default="", help="the legend's text for the new session")
    ap.add_argument("--heldout", default=None, help="what the run held out")
    ap.add_argument("--soup-with", type=Path, nargs="+", default=[], metavar="HISTORY",
                    help="history.json of each other run averaged with this one (scripts/soup_drafters.py): their "
                         "training seconds count in the CPU-hours (each on --cores), their tokens are printed")
    ap.add_argument("--title", default="DSpark drafter for SmolLM2-135M-Instruct, trained on a 2-core CPU")
    args = ap.parse_args()
    curve = args.card / "learning_curve.json"
    points = json.loads(curve.read_text())
    if args.append is not None:
        if args.session is None or args.run is None:
            ap.error("--append needs --session and --run")
        history = json.loads(args.append.read_text())
        others = [json.loads(h.read_text()) for h in args.soup_with]
        soup_seconds = sum(trained_seconds(h) for h in others)
        if others:
            tokens = sum(max(p["tokens_seen"] for p in h) for h in others)
            print(f"the soup's {len(others)} other runs: {soup_seconds / 60:.0f} minutes of training, "
                  f"{tokens / 1e6:.2f}M tokens (not on the curve's token axis)")
        points = append_run(points, history, args.session, args.run, args.cores, args.label, args.heldout, args.gpu,
                            soup_seconds)
        write_json_atomic(curve, points)
    draw(points, args.card / "learning_curve.png", args.title)
    last = points[-1]
    print(f"{len(points)} points; last: session {last['session']}, {last['tokens_seen'] / 1e6:.1f}M tokens, "
          f"{last['cpu_hours']:.1f} CPU-hours, {last.get('gpu_seconds', 0):.0f} GPU-seconds, held-out tau {last['eval_tau_tf']:.2f}")


if __name__ == "__main__":
    main()
