"""Average the weights of drafters trained from one starting point (a "model soup", Wortsman et al. 2022).

Runs continued side by side from the same drafter on different data land near each other; their mean often drafts
better than either (session 48: runs A and B, continued from run M, gave chain tau 7.362 and 7.316 summed over
GSM8K / HumanEval / MT-Bench, their mean 7.341 with the best tree of 11 of the three, 11.042). Floating-point tensors
are averaged in fp32 and stored in the first drafter's dtype; integer tensors (the draft vocabulary's maps) must be
identical. The output folder gets the first drafter's config and custom_generate/, no calibration (run
`hf-dspark calibrate` on it):

    python scripts/average_drafters.py --out runs/s48/soup-AB runs/s48/train-A/drafter runs/s48/train-B/drafter
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from hf_dspark.io_utils import atomic_path

WEIGHTS = "model.safetensors"


def _config(folder: Path) -> dict:
    if not (folder / WEIGHTS).is_file() or not (folder / "config.json").is_file():
        raise SystemExit(f"{folder} is not a saved drafter (no {WEIGHTS} or config.json); pass a run's drafter/ folder")
    config = json.loads((folder / "config.json").read_text())
    config.pop("transformers_version", None)
    return config


def average_state_dicts(state_dicts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The mean of float tensors (in fp32, cast back to the first one's dtype); integer tensors must agree."""
    first = state_dicts[0]
    for i, sd in enumerate(state_dicts[1:], 1):
        if sd.keys() != first.keys():
            raise SystemExit(f"drafter {i} has other tensors than drafter 0: {sorted(sd.keys() ^ first.keys())[:5]}")
        for name, t in sd.items():
            if t.shape != first[name].shape:
                raise SystemExit(f"{name}: shape {tuple(t.shape)} in drafter {i}, {tuple(first[name].shape)} in drafter 0")
    out = {}
    for name, t in first.items():
        if t.is_floating_point():
            out[name] = (sum(sd[name].float() for sd in state_dicts) / len(state_dicts)).to(t.dtype).contiguous()
        elif all(torch.equal(sd[name], t) for sd in state_dicts):
            out[name] = t
        else:
            raise SystemExit(f"{name} (integer) differs between the drafters: they use different draft vocabularies")
    return out


def average_drafters(folders: list[Path], out: Path) -> None:
    if len(folders) < 2:
        raise SystemExit("give at least two drafter folders to average")
    configs = [_config(f) for f in folders]
    for f, c in zip(folders[1:], configs[1:]):
        if c != configs[0]:
            diff = sorted(k for k in c.keys() | configs[0].keys() if c.get(k) != configs[0].get(k))
            raise SystemExit(f"{f} has another config than {folders[0]} ({', '.join(diff)}); only drafters of one "
                             "architecture and target can be averaged")
    averaged = average_state_dicts([load_file(str(f / WEIGHTS)) for f in folders])
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(folders[0] / "config.json", out / "config.json")
    if (folders[0] / "custom_generate").is_dir():
        shutil.copytree(folders[0] / "custom_generate", out / "custom_generate", dirs_exist_ok=True)
    (out / "calibration.json").unlink(missing_ok=True)  # the average's confidences need their own fit
    with atomic_path(out / WEIGHTS) as tmp:
        save_file(averaged, str(tmp), metadata={"format": "pt"})
    print(f"wrote the mean of {len(folders)} drafters to {out}; run `hf-dspark calibrate --drafter {out}` next")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("drafters", nargs="+", type=Path, help="saved drafter folders (e.g. runs/X/drafter), one config")
    p.add_argument("--out", type=Path, required=True, help="folder for the averaged drafter")
    args = p.parse_args(argv)
    average_drafters(args.drafters, args.out)


if __name__ == "__main__":
    main()
