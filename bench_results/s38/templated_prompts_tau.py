"""Greedy chain tau of a drafter on the last 40 prompts of session 36's templated domain mix that hold no
`def ` (math and story problems, code tasks, extraction, role-play: the text data-g36 answered; a diagnostic).

With `story` as a second argument: the last 40 multi-step story problems instead (those naming a person of
scripts/make_domain_prompts.py's PEOPLE, the GSM8K-shaped families).

Usage: python bench_results/s38/templated_prompts_tau.py DRAFTER [story]  (after `python bench_results/s36/session36_prompts.py
runs/s36`, which writes runs/s36/dom36.jsonl; run from the repository root with HF_HUB_OFFLINE=1)."""
import importlib.util
import json
import sys

import torch

from hf_dspark import DSparkDrafter
from hf_dspark.targets import load_target
from hf_dspark.training.evaluate import measure
torch.set_num_threads(1)
L = [json.loads(l)["text"] for l in open("runs/s36/dom36.jsonl")]
prompts = [t for t in L if "def " not in t]
if sys.argv[2:] == ["story"]:
    spec = importlib.util.spec_from_file_location("mdp", "scripts/make_domain_prompts.py")
    mdp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mdp)
    prompts = [t for t in prompts if any(f"{name} " in t for name, _, _ in mdp.PEOPLE)]
prompts = prompts[-40:]
m, tok = load_target("smollm2-135m-instruct")
d = DSparkDrafter.from_pretrained(sys.argv[1], target=m)
r = measure(d, m, tok, prompts, max_new_tokens=128)
print("story problems" if sys.argv[2:] == ["story"] else "templated domain prompts", "tau", round(r["tau"], 3), [round(x, 2) for x in r["per_position_acceptance"] if x])
