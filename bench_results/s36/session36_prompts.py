"""Session 36's prompt files, written to OUT (default runs/s36):

- dom36.jsonl: fresh domain prompts (scripts/make_domain_prompts.py, seed 36, minus session 34's seed-34 mix),
  answered greedily (make-data, data-g36);
- reuse.jsonl: prompts answered greedily in earlier sessions, answered again sampled at temperature 0.7 (data-t07):
  ShareGPT's first turns (decontaminated, minus the 256 held-out ones that calibrate and heldout_prompts use) followed
  by session 34's GPU domain mix (seed 34).

    python bench_results/s36/session36_prompts.py runs/s36
"""

import json
import subprocess
import sys
from pathlib import Path

from hf_dspark.training.data import decontaminate, read_prompts
from hf_dspark.training.evaluate import heldout_prompts


def domain_prompts(out: Path, seed: int, counts: dict[str, int], exclude: Path | None = None) -> list[str]:
    """Run make_domain_prompts.py and return its prompts."""
    cmd = [sys.executable, "scripts/make_domain_prompts.py", "--out", str(out), "--code", "0", "--seed", str(seed)]
    cmd += [arg for name, n in counts.items() for arg in (f"--{name}", str(n))]
    cmd += ["--exclude", str(exclude)] if exclude else []
    subprocess.run(cmd, check=True)
    return [json.loads(line)["text"] for line in out.open()]


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/s36")
    out.mkdir(parents=True, exist_ok=True)
    d34 = domain_prompts(out / "dom34.jsonl", 34, {"math": 3000, "stories": 3000, "tasks": 4000, "chat": 7000})
    domain_prompts(out / "dom36.jsonl", 36, {"math": 2000, "stories": 2000, "tasks": 2500, "chat": 3500}, out / "dom34.jsonl")
    held = set(heldout_prompts(256))
    sharegpt = [p for p in decontaminate(read_prompts("sharegpt"))[0] if p not in held]
    with (out / "reuse.jsonl").open("w") as f:
        for prompt in sharegpt + d34:
            f.write(json.dumps({"text": prompt}) + "\n")
    print(f"reuse.jsonl: {len(sharegpt)} ShareGPT first turns + {len(d34)} seed-34 domain prompts")


if __name__ == "__main__":
    main()
