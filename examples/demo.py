"""`make demo`: speculative generation with the shipped DSpark drafter on real SmolLM2-135M-Instruct.

Loads the target (bf16 where the CPU has native bf16, else fp32) and `model_cards/dspark-smollm2-135m-instruct`, generates for a math, a code and a
chat prompt with `model.generate(..., assistant_model=drafter)`, prints the texts, tau and per-position
acceptance, and measures the speedup against plain `generate()` in the same run (one timed run each after a warm-up, greedy).
Writes `outputs/demo_acceptance.png`.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

import hf_dspark
from hf_dspark.bench import default_drafter
from hf_dspark.targets import fast_dtype, load_target

PROMPTS = {
    "math": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May? Think step by step.",
    "code": "Write a Python function `is_palindrome(s: str) -> bool` that ignores case and spaces, with a docstring and two examples.",
    "chat": "Give me three tips for staying focused while studying, in short bullet points.",
}
MAX_NEW_TOKENS = 64
REPEATS = 1


def timed(fn) -> tuple[float, torch.Tensor]:
    times, out = [], None
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> int:
    torch.manual_seed(0)
    dtype = fast_dtype()  # bf16 where the CPU multiplies bf16 natively, else fp32 (see README)
    model, tok = load_target("smollm2-135m-instruct", dtype=dtype)
    drafter = hf_dspark.DSparkDrafter.from_pretrained(default_drafter(), target=model)
    print(f"target: SmolLM2-135M-Instruct ({str(dtype).removeprefix('torch.')}, {torch.get_num_threads()} threads); drafter: {default_drafter().name} "
          f"(block {drafter.config.block_size}, markov rank {drafter.config.markov_rank})\n")
    plain_total = spec_total = 0.0
    taus, accept = [], []
    for name, prompt in PROMPTS.items():
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        enc = tok(text, return_tensors="pt")
        kw = dict(max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
        model.generate(**enc, **kw, assistant_model=drafter)  # warm-up
        t_plain, ref = timed(lambda: model.generate(**enc, **kw))
        t_spec, out = timed(lambda: model.generate(**enc, **kw, assistant_model=drafter))
        stats = drafter.last_stats
        plain_total, spec_total = plain_total + t_plain, spec_total + t_spec
        taus.append(stats.mean_accepted_length)
        accept.append(stats.per_position_acceptance)
        new = out[0, enc["input_ids"].shape[1] :]
        print(f"=== {name}: {prompt}")
        print(tok.decode(new, skip_special_tokens=True).strip())
        print(
            f"--- tau {stats.mean_accepted_length:.2f} | per-position acceptance "
            + " ".join(f"{a:.2f}" for a in stats.per_position_acceptance)
            + f" | {len(new)} tokens: plain {t_plain:.2f}s, DSpark {t_spec:.2f}s -> {t_plain / t_spec:.2f}x"
            + f" | identical to plain generate(): {torch.equal(out, ref)}\n"
        )
    print(f"overall speedup vs plain generate(): {plain_total / spec_total:.2f}x (timed after a warm-up, {REPEATS} run(s) per prompt)")
    plot(accept, taus)
    return 0


def plot(accept: list[list[float]], taus: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path("outputs")
    out.mkdir(exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for (name, _), acc, tau in zip(PROMPTS.items(), accept, taus):
        ax.plot(range(1, len(acc) + 1), acc, "o-", label=f"{name} (tau {tau:.2f})")
    ax.set_xlabel("draft position")
    ax.set_ylabel("P(accept | earlier drafts accepted)")
    ax.set_ylim(0, 1)
    ax.set_title("DSpark on SmolLM2-135M-Instruct")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "demo_acceptance.png", dpi=110)
    print(f"wrote {out / 'demo_acceptance.png'}")


if __name__ == "__main__":
    sys.exit(main())
