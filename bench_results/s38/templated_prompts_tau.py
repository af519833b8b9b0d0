"""Greedy chain tau of a drafter on the last 40 prompts of session 36's templated domain mix that hold no
`def ` (math and story problems, code tasks, extraction, role-play: the text data-g36 answered; a diagnostic), or with
`--story` on the last 40 multi-step story problems among them (those naming a person of
scripts/make_domain_prompts.py's PEOPLE: the GSM8K-shaped families).

Run from the repository root with HF_HUB_OFFLINE=1, after `python bench_results/s36/session36_prompts.py runs/s36`
(which writes runs/s36/dom36.jsonl)."""

import argparse
import importlib.util
import json
from pathlib import Path

import torch

from hf_dspark import DSparkDrafter
from hf_dspark.targets import load_target
from hf_dspark.training.evaluate import measure

PROMPTS = Path("runs/s36/dom36.jsonl")


def story_names() -> list[str]:
    """The story families' first names, from scripts/make_domain_prompts.py (a script, not a package)."""
    spec = importlib.util.spec_from_file_location("make_domain_prompts", "scripts/make_domain_prompts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [name for name, _, _ in module.PEOPLE]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafter", help="drafter folder")
    parser.add_argument("--story", action="store_true", help="the story problems only")
    args = parser.parse_args()
    if not PROMPTS.is_file():
        parser.error(f"{PROMPTS} is missing: run `python bench_results/s36/session36_prompts.py runs/s36` first.")
    torch.set_num_threads(1)
    prompts = [t for t in (json.loads(line)["text"] for line in PROMPTS.open()) if "def " not in t]
    if args.story:
        names = story_names()
        prompts = [t for t in prompts if any(f"{name} " in t for name in names)]
    model, tok = load_target("smollm2-135m-instruct")
    drafter = DSparkDrafter.from_pretrained(args.drafter, target=model)
    r = measure(drafter, model, tok, prompts[-40:], max_new_tokens=128)
    label = "story problems" if args.story else "templated domain prompts"
    print(label, "tau", round(r["tau"], 3), [round(x, 2) for x in r["per_position_acceptance"] if x])


if __name__ == "__main__":
    main()
