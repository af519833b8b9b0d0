"""Is one drafter really better than another? A paired comparison of two `hf-dspark eval-tau` results.

    python scripts/compare_tau.py BASE.json CANDIDATE.json [--resamples 10000] [--seed 0]

Both files must come from the same prompts and settings (only the drafter may differ). Greedy decoding is
deterministic, so the uncertainty in a tau difference is which prompts were drawn. Per set, this resamples the
prompts with replacement, the same ones for both drafters, and recomputes each tau as committed tokens over steps.
It prints the difference (candidate - base), its 95% bootstrap interval, and the share of resamples in which the
candidate is ahead. The "summed" row resamples each set on its own and adds the differences, like the summed tau used
to ship drafters. With eval-tau's --batch-size N > 1 the unit resampled is a batch of N prompts. Results written
before eval-tau recorded per-prompt counts must be rerun.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

SAME_SETTINGS_EXCEPT = ("drafter", "adapter")


def load_result(path: str) -> dict:
    """An eval-tau JSON, checked for the per-prompt counts."""
    res = json.loads(Path(path).read_text())
    sets = [k for k in res if k != "settings"]
    for name in sets:
        if "steps_per_call" not in res[name]:
            raise SystemExit(f"{path}: set {name!r} has no per-prompt counts (written by an older eval-tau); "
                             "rerun `hf-dspark eval-tau` on it to compare")
    return res


def check_comparable(base: dict, cand: dict, allowed: tuple[str, ...] = ()) -> list[str]:
    """The sets both results hold, after checking they ran with the same settings (but `allowed`) and prompts."""
    keys = set(base["settings"]) | set(cand["settings"])
    same = keys - set(SAME_SETTINGS_EXCEPT) - set(allowed)
    differ = sorted(k for k in same if base["settings"].get(k) != cand["settings"].get(k))
    if differ:
        raise SystemExit(f"the two results ran with different settings ({', '.join(differ)}); compare results of the "
                         "same eval-tau command with another --drafter, or name the decoding options you compare "
                         f"with --allow {','.join(differ)}")
    sets = [k for k in base if k != "settings" and k in cand]
    if not sets:
        raise SystemExit("the two results share no prompt set")
    for name in sets:
        if len(base[name]["steps_per_call"]) != len(cand[name]["steps_per_call"]):
            raise SystemExit(f"set {name!r}: {len(base[name]['steps_per_call'])} against "
                             f"{len(cand[name]['steps_per_call'])} prompts; compare runs over the same prompts")
    return sets


def counts(res: dict, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-prompt ([n] steps, [n] committed tokens) of one set."""
    return np.asarray(res[name]["steps_per_call"], dtype=np.float64), np.asarray(res[name]["tokens_per_call"], dtype=np.float64)


def tau_difference_samples(base: tuple, cand: tuple, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """[resamples] candidate tau - base tau, each over one draw of the prompts with replacement (paired)."""
    (s0, t0), (s1, t1) = base, cand
    idx = rng.integers(0, len(s0), size=(resamples, len(s0)))  # [R, n] prompt indices
    return t1[idx].sum(1) / s1[idx].sum(1) - t0[idx].sum(1) / s0[idx].sum(1)


def compare(base: dict, cand: dict, resamples: int = 10_000, seed: int = 0, allowed: tuple[str, ...] = ()) -> list[dict]:
    """One row per shared set, then "summed": tau of each, the difference, its 95% interval, P(candidate ahead)."""
    rng = np.random.default_rng(seed)
    rows, total = [], np.zeros(resamples)
    for name in check_comparable(base, cand, allowed):
        b, c = counts(base, name), counts(cand, name)
        diffs = tau_difference_samples(b, c, resamples, rng)
        total += diffs
        rows.append(_row(name, b[1].sum() / b[0].sum(), c[1].sum() / c[0].sum(), diffs))
    if len(rows) > 1:
        rows.append(_row("summed", sum(r["base"] for r in rows), sum(r["candidate"] for r in rows), total))
    return rows


def _row(name: str, base_tau: float, cand_tau: float, diffs: np.ndarray) -> dict:
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return {"set": name, "base": float(base_tau), "candidate": float(cand_tau), "difference": float(cand_tau - base_tau),
            "interval": [float(lo), float(hi)], "p_ahead": float((diffs > 0).mean())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("base", help="eval-tau JSON of the drafter to beat (e.g. the shipped one)")
    p.add_argument("candidate", help="eval-tau JSON of the candidate, same command with another --drafter")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap draws of the prompts (default 10000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--allow", default="", metavar="SETTING[,SETTING]",
                   help="settings that may differ, to compare decoding options on the same drafter (e.g. copy_ngram)")
    args = p.parse_args()
    if args.resamples < 100:
        p.error(f"--resamples must be >= 100 for a 95% interval, got {args.resamples}")
    allowed = tuple(k for k in args.allow.split(",") if k)
    rows = compare(load_result(args.base), load_result(args.candidate), args.resamples, args.seed, allowed)
    print(f"{'set':10s} {'base':>7s} {'cand':>7s} {'cand-base':>10s}   95% interval        P(cand ahead)")
    for r in rows:
        lo, hi = r["interval"]
        print(f"{r['set']:10s} {r['base']:7.3f} {r['candidate']:7.3f} {r['difference']:+10.3f}   "
              f"[{lo:+.3f}, {hi:+.3f}]   {r['p_ahead']:.2f}")


if __name__ == "__main__":
    main()
