"""Average drafters of one shape (a weight soup): OUT = sum_i w_i * DRAFTER_i, tensor by tensor.

    python scripts/soup_drafters.py A B [C ...] OUT [--weights 0.5,0.5] [--target smollm2-135m-instruct]

Continuations of one drafter (e.g. runs trained further on other data, or with other seeds) often average into one
that keeps what each does best. The weights default to a uniform mean. The output drafts A's vocabulary: a drafter
whose draft vocabulary differs is first remapped to A's (`hf_dspark.training.trainer.remap_draft_vocab`), and the
lm_head / Markov W2 row of each token is the weighted mean over the drafters that had it (A always has it). Writes
OUT/config.json + model.safetensors (bf16, A's config); no calibration (run `hf-dspark calibrate`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from hf_dspark import DSparkDrafter
from hf_dspark.targets import load_target
from hf_dspark.training.trainer import remap_draft_vocab

ROW_TENSORS = ("lm_head.weight", "markov_head.markov_w2.weight")  # one row per draft token


def on_vocab_of(first: DSparkDrafter, other: DSparkDrafter, target) -> tuple[DSparkDrafter, torch.Tensor | None]:
    """`other` remapped to `first`'s draft vocabulary, and which of `first`'s draft rows it had ([D] bool; None: all)."""
    first_ids, other_ids = first.draft_target_ids(), other.draft_target_ids()
    if first_ids is None or (other_ids is not None and torch.equal(first_ids.cpu(), other_ids.cpu())):
        return other, None
    had = torch.zeros(first.config.vocab_size, dtype=torch.bool)
    had[other_ids.cpu() if other_ids is not None else torch.arange(other.draft_vocab_size)] = True
    return remap_draft_vocab(other.float(), target, first_ids.cpu()), had[first_ids.cpu()]


def soup(drafters: list[DSparkDrafter], target, weights: list[float]) -> DSparkDrafter:
    """sum_i weights[i] * drafters[i] in fp32 on drafters[0]'s draft vocabulary; a token's rows are the weighted mean
    over the drafters that drafted it. Returns drafters[0], overwritten."""
    if len(drafters) != len(weights) or len(drafters) < 2:
        raise ValueError(f"{len(drafters)} drafters and {len(weights)} weights: give two or more of each, paired")
    first = drafters[0].float()
    remapped = [(first, None)] + [on_vocab_of(first, d, target) for d in drafters[1:]]
    states = [(d.float().state_dict(), had) for d, had in remapped]
    out = {}
    for name, t0 in states[0][0].items():
        if not t0.is_floating_point():
            out[name] = t0  # d2t / t2d maps: the first drafter's
            continue
        if name not in ROW_TENSORS:
            out[name] = sum(w * state[name].to(t0.device) for (state, _), w in zip(states, weights)) / sum(weights)
            continue
        per_row = (-1,) + (1,) * (t0.dim() - 1)  # a [D] weight broadcast over each row
        total, mass = torch.zeros_like(t0), torch.zeros(t0.shape[0])  # [D, ...], [D]: per draft row
        for (state, had), w in zip(states, weights):
            keep = torch.ones_like(mass) if had is None else had.to(mass.dtype)  # [D]: did this drafter have the row
            total += w * keep.view(per_row) * state[name].to(t0.device)
            mass += w * keep
        out[name] = total / mass.view(per_row)
    first.load_state_dict(out)
    return first


def parse_weights(text: str | None, n: int) -> list[float]:
    """--weights as n non-negative numbers scaled to sum to 1; None: uniform."""
    if text is None:
        return [1.0 / n] * n
    try:
        weights = [float(w) for w in text.split(",")]
    except ValueError:
        raise SystemExit(f"--weights {text!r}: give {n} comma-separated numbers, e.g. --weights 0.5,0.5") from None
    if len(weights) != n or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise SystemExit(f"--weights {text!r}: give {n} non-negative numbers (one per drafter), not all zero")
    return [w / sum(weights) for w in weights]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("drafters", type=Path, nargs="+", metavar="DRAFTER", help="two or more drafter folders")
    p.add_argument("out", type=Path, help="output folder")
    p.add_argument("--weights", help="comma-separated weights, one per drafter, scaled to sum to 1 (default: uniform)")
    p.add_argument("--target", default="smollm2-135m-instruct")
    args = p.parse_args()
    if len(args.drafters) < 2:
        raise SystemExit("give two or more drafter folders, then the output folder")
    weights = parse_weights(args.weights, len(args.drafters))
    target, _ = load_target(args.target, dtype=torch.float32)
    drafters = [DSparkDrafter.from_pretrained(str(d), target=target).float() for d in args.drafters]
    mixed = soup(drafters, target, weights)
    mixed.to(torch.bfloat16).save_pretrained(str(args.out))
    print(f"[soup] {args.out}: " + " + ".join(f"{w:.3g} x {d}" for w, d in zip(weights, args.drafters)))


if __name__ == "__main__":
    main()
