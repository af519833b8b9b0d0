"""Grow and redraw the model card's learning curve across sessions.

The card keeps every held-out evaluation of every run in `learning_curve.json` (cumulative steps, training tokens
and CPU-hours) and draws it as `learning_curve.png`, one line per run. A run resumed from the last one adds its
`history.json` with `--append`:

    python scripts/card_learning_curve.py --card model_cards/dspark-smollm2-135m-instruct \
        --append runs/train-j/history.json --session 20 --run j --cores 2 \
        --label "held-out: 26 new ShareGPT answers; fresh data only"

Without `--append` it only redraws the figure from the JSON.

The card also keeps the real measure, greedy chain tau on the eval sets (`eval-tau --copy-ngram 0`, 40 prompts per
set) against cumulative training tokens, in `eval_curve.json`, drawn as `eval_curve.png` with a least-squares fit of
tau against log(tokens) per set, extended to the goals. A session that ships adds its row with `--add-eval`:

    python scripts/card_learning_curve.py --card model_cards/dspark-smollm2-135m-instruct \
        --add-eval "session 59 (0.75 x session 52's weights + 0.125 x runs A and B)" 35.5 34.5 2.705 2.668 2.085
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
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


EVAL_SETS = ("gsm8k", "humaneval", "mtbench")
FIT_MIN_PROMPTS = 40  # rows measured on fewer prompts per set are drawn, not fitted


def fit_log_tokens(rows: list[dict]) -> dict[str, tuple[float, float]]:
    """Per eval set, the least-squares line tau = a + b * ln(tokens in millions) over the rows measured on at least
    FIT_MIN_PROMPTS prompts per set: {set: (a, b)}."""
    rows = [r for r in rows if r["prompts"] >= FIT_MIN_PROMPTS]
    if len({r["tokens_m"] for r in rows}) < 2:
        raise SystemExit(f"fitting needs rows at two or more token counts measured on >= {FIT_MIN_PROMPTS} prompts")
    xs = [math.log(r["tokens_m"]) for r in rows]
    mx = sum(xs) / len(xs)
    fits = {}
    for name in EVAL_SETS:
        ys = [r[name] for r in rows]
        my = sum(ys) / len(ys)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        fits[name] = (my - b * mx, b)
    return fits


def tokens_for(tau: float, fit: tuple[float, float]) -> float:
    """Millions of training tokens at which the fitted line reaches `tau` (inf where it never rises)."""
    a, b = fit
    return math.exp((tau - a) / b) if b > 0 else math.inf


def fit_report(curve: dict) -> str:
    """One line per eval set: the fit's gain per doubling of tokens, and the tokens at which it reaches the goal."""
    fits = fit_log_tokens(curve["rows"])
    last = curve["rows"][-1]
    lines = [f"tau against ln(training tokens), rows measured on >= {FIT_MIN_PROMPTS} prompts; "
             f"now {last['tokens_m']:.1f}M tokens:"]
    for name in EVAL_SETS:
        goal, need = curve["goals"][name], tokens_for(curve["goals"][name], fits[name])
        reached = ("reached" if last[name] >= goal else "the fit does not rise" if math.isinf(need)
                   else f"the fit reaches it at ~{need:.0f}M tokens")
        lines.append(f"  {name}: {last[name]:.2f} now, +{fits[name][1] * math.log(2):.3f} per doubling; "
                     f"goal {goal}: {reached}")
    return "\n".join(lines)


def draw_eval(curve: dict, path: Path, title: str) -> None:
    """Eval-set chain tau against cumulative training tokens (log axis), the fits extended to the goals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, fits = curve["rows"], fit_log_tokens(curve["rows"])
    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    for name, color in zip(EVAL_SETS, ("C0", "C1", "C2")):
        for fitted in (True, False):  # rows on fewer prompts are drawn hollow and left out of the fit
            part = [r for r in rows if (r["prompts"] >= FIT_MIN_PROMPTS) == fitted]
            ax.plot([r["tokens_m"] for r in part], [r[name] for r in part], "o", color=color, ms=4,
                    mfc=color if fitted else "none", label=name if fitted else None)
        goal = curve["goals"][name]
        end = min(max(tokens_for(goal, fits[name]), rows[-1]["tokens_m"]) * 1.1, 1000.0)
        xs = [rows[0]["tokens_m"] * (end / rows[0]["tokens_m"]) ** (i / 50) for i in range(51)]
        ax.plot(xs, [fits[name][0] + fits[name][1] * math.log(x) for x in xs], "-", color=color, alpha=0.5)
        ax.axhline(goal, color=color, ls="--", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("cumulative training tokens (millions, log scale)")
    ax.set_ylabel(f"greedy chain tau, drafter alone ({FIT_MIN_PROMPTS} prompts per set; hollow: fewer)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(title="points, fit (solid), goal (dashed)", fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
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
    ap.add_argument("--add-eval", nargs=6, default=None, metavar=("WHAT", "TOKENS_M", "CPU_HOURS", "GSM8K", "HUMANEVAL",
                                                                    "MTBENCH"),
                    help="add the shipped weights' row to eval_curve.json: what they are, cumulative training tokens "
                         f"(millions), CPU-hours, and chain tau without copies over {FIT_MIN_PROMPTS} prompts per set")
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
    evals_path = args.card / "eval_curve.json"
    if args.add_eval and not evals_path.exists():
        ap.error(f"--add-eval: {evals_path} does not exist")
    if evals_path.exists():
        evals = json.loads(evals_path.read_text())
        if args.add_eval:
            what, *numbers = args.add_eval
            tokens_m, cpu_hours, *taus = (float(x) for x in numbers)
            if tokens_m <= evals["rows"][-1]["tokens_m"]:
                ap.error(f"--add-eval: {tokens_m}M tokens is not past the last row's {evals['rows'][-1]['tokens_m']}M")
            evals["rows"].append({"what": what, "tokens_m": tokens_m, "cpu_hours": cpu_hours,
                                  "prompts": FIT_MIN_PROMPTS, **dict(zip(EVAL_SETS, taus))})
            write_json_atomic(evals_path, evals)
        draw_eval(evals, args.card / "eval_curve.png", args.title)
        print(fit_report(evals))
    last = points[-1]
    print(f"{len(points)} points; last: session {last['session']}, {last['tokens_seen'] / 1e6:.1f}M tokens, "
          f"{last['cpu_hours']:.1f} CPU-hours, {last.get('gpu_seconds', 0):.0f} GPU-seconds, held-out tau {last['eval_tau_tf']:.2f}")


if __name__ == "__main__":
    main()
