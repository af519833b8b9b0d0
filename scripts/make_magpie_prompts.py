"""Let the target write its own training prompts (Magpie: Xu et al., 2024): the chat template up to the start of a
user turn, sampled, gives user requests in the distribution the model was instruction-tuned on, with no data set.
A share of the turns start from a few opening words (word problems, programming requests) to lean towards the
evaluation sets' domains without reading them.

The output is JSONL with a `text` field (and `kind`), ready for `hf-dspark make-data --prompts FILE`, which
decontaminates it against GSM8K, HumanEval and MT-Bench as for any prompt file. Rerunning the same command resumes.

    OMP_NUM_THREADS=1 python scripts/make_magpie_prompts.py --out runs/magpie-0.jsonl --n 2000 --seed 0
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

import torch
from tqdm import tqdm

from hf_dspark.io_utils import write_text_atomic
from hf_dspark.targets import fast_dtype, load_target

# Opening words per kind; "open" lets the model write the whole turn.
OPENINGS = {
    "open": [""],
    "math": ["A", "There are", "If", "Each", "In a", "At the", "Sarah", "Tom has", "A store sells", "John buys",
             "Maria is", "The", "A farmer", "Ken wants", "Jenny earns", "A school", "Mark runs", "Lisa baked",
             "A train travels", "Carla has", "Solve this word problem:", "A bakery", "Ahmed saves"],
    "code": ["Write a Python function", "Write a function", "Complete the following Python function:\n\n```python\ndef",
             "Implement a Python function", "How do I write a Python function that", "Write a Python program that",
             "Can you write a Python function to", "Given a list of", "Write a Python class"],
}


def user_turn_prefix(tok) -> str:
    """The chat template's text up to where a user's message starts (system prompt included)."""
    text = tok.apply_chat_template([{"role": "user", "content": "\x00"}], tokenize=False)
    return text[: text.index("\x00")]


def keep(text: str) -> bool:
    """A usable request: long enough, not runaway, not a chat-template fragment."""
    return 15 <= len(text) <= 1500 and "<|im_" not in text and "assistant" not in text[:20]


def resume(path: Path) -> set[str]:
    """The prompts an earlier run of the same command wrote to `path` (a torn last line is dropped from the file)."""
    if not path.exists():
        return set()
    text = path.read_text()
    lines = [line for line in text.splitlines(keepends=True) if line.endswith("\n")]
    if len("".join(lines)) != len(text):  # a killed run's torn line: rewrite without it
        write_text_atomic(path, "".join(lines))
    return {json.loads(line)["text"] for line in lines}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSONL to write (appended to and resumed if it exists)")
    parser.add_argument("--n", type=int, default=2000, help="prompts to write")
    parser.add_argument("--mix", default="open:0.5,math:0.25,code:0.25", help="kind:share,... of the prompts")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128, help="a turn still running at this length is dropped")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    args = parser.parse_args()
    try:
        mix = {k: float(v) for k, v in (part.split(":") for part in args.mix.split(","))}
    except ValueError:
        parser.error(f"--mix {args.mix!r}: expected kind:share pairs separated by commas, e.g. open:0.5,math:0.3,code:0.2")
    unknown = set(mix) - set(OPENINGS)
    if unknown:
        parser.error(f"--mix names unknown kinds {sorted(unknown)}; known: {sorted(OPENINGS)}")
    model, tok = load_target(args.target, dtype=fast_dtype())
    tok.padding_side = "left"
    end = tok.eos_token_id  # the end of a chat turn (SmolLM2: <|im_end|>)
    prefix = user_turn_prefix(tok)
    seen = resume(args.out)
    done = len(seen)
    rng = random.Random(f"{args.seed}-{done}")
    torch.manual_seed(rng.randrange(2**31))
    kinds, weights = list(mix), list(mix.values())
    with args.out.open("a") as out, tqdm(total=args.n, initial=done, desc="prompts") as bar:
        while done < args.n:
            batch = [(kind, rng.choice(OPENINGS[kind])) for kind in rng.choices(kinds, weights, k=args.batch_size)]
            enc = tok([prefix + opening for _, opening in batch], return_tensors="pt", padding=True)
            with torch.no_grad():
                gen = model.generate(**enc, do_sample=True, temperature=args.temperature, top_p=args.top_p,
                                     max_new_tokens=args.max_new_tokens, eos_token_id=end, pad_token_id=end)
            for (kind, opening), row in zip(batch, gen[:, enc.input_ids.shape[1]:]):
                if end not in row.tolist():
                    continue  # ran past --max-new-tokens
                text = (opening + tok.decode(row, skip_special_tokens=True)).strip()
                if keep(text) and text not in seen and done < args.n:
                    seen.add(text)
                    out.write(json.dumps({"text": text, "kind": kind}) + "\n")
                    done += 1
                    bar.update(1)
            out.flush()
            os.fsync(out.fileno())


if __name__ == "__main__":
    main()
