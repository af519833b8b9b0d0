"""Average two drafters of one shape (a weight soup): OUT = alpha * A + (1 - alpha) * B, tensor by tensor.

    python scripts/soup_drafters.py A B OUT --alpha 0.5 [--target smollm2-135m-instruct]

A continued drafter (e.g. one trained further on other data) and the drafter it started from often average into one
that keeps what each does best. When their draft vocabularies differ, B is first remapped to A's
(`hf_dspark.training.trainer.remap_draft_vocab`), and the lm_head / Markov W2 rows of tokens that B never had come
from A alone. Writes OUT/config.json + model.safetensors (bf16, A's config); no calibration (run `hf-dspark calibrate`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from hf_dspark import DSparkDrafter
from hf_dspark.targets import load_target
from hf_dspark.training.trainer import remap_draft_vocab


def soup(a: DSparkDrafter, b: DSparkDrafter, target, alpha: float) -> DSparkDrafter:
    """alpha * a + (1 - alpha) * b in fp32, b on a's draft vocabulary; rows of tokens b lacked stay a's."""
    a_ids, b_ids = a.draft_target_ids(), b.draft_target_ids()
    if a_ids is not None and (b_ids is None or not torch.equal(a_ids.cpu(), b_ids.cpu())):
        had = torch.zeros(a.config.vocab_size, dtype=torch.bool)
        had[b_ids.cpu() if b_ids is not None else torch.arange(b.draft_vocab_size)] = True
        b_had = had[a_ids.cpu()]  # [D] per draft row of a: did b draft that token?
        b = remap_draft_vocab(b.float(), target, a_ids.cpu())
    else:
        b_had = None
    sa, sb = a.float().state_dict(), b.float().state_dict()
    out = {}
    for name, ta in sa.items():
        tb = sb[name]
        if not ta.is_floating_point():
            out[name] = ta  # d2t / t2d maps: a's
            continue
        mixed = alpha * ta + (1.0 - alpha) * tb.to(ta.device)
        if b_had is not None and name in ("lm_head.weight", "markov_head.markov_w2.weight"):
            mixed[~b_had] = ta[~b_had]
        out[name] = mixed
    a.load_state_dict(out)
    return a


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--alpha", type=float, default=0.5, help="weight of A (default 0.5)")
    p.add_argument("--target", default="smollm2-135m-instruct")
    args = p.parse_args()
    if not 0.0 <= args.alpha <= 1.0:
        raise SystemExit(f"--alpha {args.alpha} must lie in [0, 1]")
    target, _ = load_target(args.target, dtype=torch.float32)
    a = DSparkDrafter.from_pretrained(str(args.a), target=target).float()
    b = DSparkDrafter.from_pretrained(str(args.b), target=target).float()
    mixed = soup(a, b, target, args.alpha)
    mixed.to(torch.bfloat16).save_pretrained(str(args.out))
    print(f"[soup] {args.out}: {args.alpha} x {args.a} + {1 - args.alpha} x {args.b}")


if __name__ == "__main__":
    main()
