"""`make demo`: speculative generation with the shipped DSpark drafter on real SmolLM2-135M-Instruct.

1. Exactness, in fp32: one prompt through DSpark verifying the full block at every step, compared token by token
   with plain `generate()`.
2. Speed, in the dtype this CPU multiplies fastest (bf16 with avx512_bf16/AMX, else fp32): a math, a code and a
   chat prompt, greedy, with `model.generate(..., assistant_model=drafter)` and with plain `generate()`, after a
   warm-up each timed three times in turn in the same run (medians), DSpark three ways: verifying the drafter's
   chain of 7 drafts (the full block) at every step; with the DSpark scheduler, which decides at every step how many
   of them to verify (0: a plain step) from this device's step-time table (on first use the demo profiles the table
   and caches it where `generate()` looks for it); and verifying a tree of N drafts, the drafter's most likely ones
   and a prompt-lookup branch among them, what `generate()` verifies for one prompt by default (N sized from the
   step table: the widest verify step this device pays for; the full block's 7 without a table).
Prints the texts, tau, the acceptance per draft position and the speedups; writes `outputs/demo_acceptance.png`.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch
from transformers.utils import logging

import hf_dspark
from hf_dspark.bench import default_drafter
from hf_dspark.cpu_load import OtherCpuUse, contention_warning
from hf_dspark.generation import choose_policy, default_tree_size
from hf_dspark.prepack import is_prepacked
from hf_dspark.scheduler import AdaptiveVerification
from hf_dspark.step_table import InvalidStepTableError, load_or_profile, local_table_path
from hf_dspark.targets import fast_dtype, load_target

TARGET = "smollm2-135m-instruct"
PROMPTS = {
    "math": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May? Think step by step.",
    "code": "Write a Python function `is_palindrome(s: str) -> bool` that ignores case and spaces, with a docstring and two examples.",
    "chat": "Give me three tips for staying focused while studying, in short bullet points.",
}
MAX_NEW_TOKENS = 64
CHECK_NEW_TOKENS = 32
TREE_SIZE = 7  # drafts in the exactness check's draft tree: as many as the chain's
REPEATS = 3  # timed runs per contender and prompt, taken in turn; the demo reports their medians
# the step table the demo profiles on first use: every default probe (1-512 tokens), fewer repeats than
# `hf-dspark profile` (seconds on a 2-core CPU)
PROFILE = dict(repeats=3, warmup=1, progress=False)


def main() -> int:
    torch.manual_seed(0)
    logging.disable_progress_bar()
    print(f"drafter: {default_drafter().name}; target: SmolLM2-135M-Instruct; {torch.get_num_threads()} threads\n")
    if not exactness_check():
        return 1
    dtype = fast_dtype()  # bf16 where the CPU multiplies bf16 natively, else fp32 (README, "Limits")
    model, tok = load_target(TARGET, dtype=dtype)
    drafter = hf_dspark.DSparkDrafter.from_pretrained(default_drafter(), target=model)
    scheduler = drafter.confidence_head is not None and has_step_table(model)  # it reads the drafter's confidences
    policies = {"the full block": dict(adaptive_verification=False)}
    if scheduler:
        policies["the DSpark scheduler"] = dict(adaptive_verification=True)
    # the policy generate() chooses when a call names no verify option, and the tree it then verifies for one prompt
    default = choose_policy(model, drafter, verify_policy=None, confidence_threshold=None, adaptive_verification=None,
                            num_speculative_tokens=None, quiet=True)
    tree = default_tree_size(model, drafter, default)
    if tree is not None:
        policies[f"a tree of {tree} (the default)"] = {}  # what generate() verifies for one prompt, options left out
    packed = ", linear layers prepacked for small batches (hf_dspark.prepack_linears)" if is_prepacked(model) else ""
    print(f"\n2. Speed ({name(dtype)}{packed}, greedy, batch 1, {MAX_NEW_TOKENS} new tokens): DSpark verifying "
          f"{' / '.join(policies)} at every step, against plain generate() on the same model.")
    if tree is not None:
        how = "sized from the step table" if isinstance(default, AdaptiveVerification) else "no step table: the block's"
        print(f"   the tree: {tree} drafts (draft_tree_size={tree}, {how}; what generate() verifies for one prompt by "
              "default), the drafter's most likely ones, grown from its one backbone pass through the Markov head, and "
              "a prompt-lookup branch (the tokens that follow the latest earlier occurrence of the last few) competing with them "
              "for the places, verified in one forward; tau counts its accepted path")
    print("   acceptance per draft position k: P(draft k accepted | drafts before it accepted), over the steps that "
          "verified it; '-': no step verified a draft there\n")
    with OtherCpuUse() as load:
        runs = [speed_run(model, tok, drafter, policies, label, prompt) for label, prompt in PROMPTS.items()]
    plain_total = sum(r.plain_s for r in runs)
    spec_total = {policy: sum(r.spec_s[policy] for r in runs) for policy in policies}
    differs = any(r.differs_at is not None for r in runs)
    for policy, total in spec_total.items():
        print(
            f"overall: DSpark with {policy} {total:.2f} s against plain generate() {plain_total:.2f} s for {len(PROMPTS)} x "
            f"{MAX_NEW_TOKENS} new tokens: {plain_total / total:.2f}x ({name(dtype)}, {torch.get_num_threads()} threads, "
            f"greedy, batch 1, medians of {REPEATS} timed runs each, taken in turn after a warm-up)"
        )
    if differs and dtype == torch.float32:
        print("in fp32 DSpark must be token-identical to plain generate(): please report this as a bug")
    elif differs:
        print(
            f"the {name(dtype)} texts that differ from plain generate() do so because a {name(dtype)} forward over "
            "several verify tokens rounds unlike one-token forwards, which can flip a near-tie; both are valid outputs "
            "of the model, and in fp32 DSpark is token-identical (check 1)"
        )
    if warning := contention_warning(load.cores):
        print(warning)
    plot([r.stats.per_position_acceptance for r in runs], [r.stats.mean_accepted_length for r in runs])
    return 0


@dataclass
class SpeedRun:
    plain_s: float  # plain generate()
    spec_s: dict[str, float]  # per verify policy
    stats: Any  # DSparkStats of the full block
    taus: dict[str, float]  # tau per verify policy (its warm-up call)
    differs_at: int | None  # the first new token where the full block's text differs from plain generate()'s


def speed_run(model, tok, drafter, policies: dict[str, dict], label: str, prompt: str) -> SpeedRun:
    """One prompt: plain generate() and DSpark with each verify policy, warmed up, then timed REPEATS times in turn
    (medians); prints the full block's text, tau, acceptance per position and the speedups."""
    enc = tok(chat(tok, prompt), return_tensors="pt")
    kw = dict(max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    runs = {"plain": lambda: model.generate(**enc, **kw)}
    for policy, options in policies.items():
        runs[policy] = lambda o=options: model.generate(**enc, **kw, **o, assistant_model=drafter)
    ref, shown, taus = runs["plain"](), None, {}
    for policy in policies:  # warm-up (the scheduler also learns this device's prices)
        out = runs[policy]()
        shown = shown or (out, drafter.last_stats)  # text and acceptance of the full block
        taus[policy] = drafter.last_stats.mean_accepted_length
    times = medians_in_turn(runs, REPEATS)
    t_plain = times.pop("plain")
    out, stats = shown
    prompt_len = enc["input_ids"].shape[1]
    same = first_difference(out[0, prompt_len:], ref[0, prompt_len:])
    print(f"=== {label}: {prompt}")
    print(tok.decode(out[0, prompt_len:], skip_special_tokens=True).strip())
    acceptance = " ".join("-" if math.isnan(a) else f"{a:.2f}" for a in stats.per_position_acceptance)
    print(f"--- full block: tau {stats.mean_accepted_length:.2f} | acceptance per position {acceptance} | same text "
          "as plain generate(): " + ("yes" if same is None else f"no, from new token {same + 1} on"))
    print(f"--- plain {t_plain:.2f} s; " + "; ".join(f"{p} {t:.2f} s: {t_plain / t:.2f}x (tau {taus[p]:.2f})"
                                                    for p, t in times.items()) + "\n")
    return SpeedRun(t_plain, times, stats, taus, same)


def exactness_check() -> bool:
    """fp32, the math prompt, the full block verified at every step: DSpark's tokens must be plain generate()'s."""
    model, tok = load_target(TARGET, dtype=torch.float32)
    drafter = hf_dspark.DSparkDrafter.from_pretrained(default_drafter(), target=model)
    enc = tok(chat(tok, PROMPTS["math"]), return_tensors="pt")
    kw = dict(max_new_tokens=CHECK_NEW_TOKENS, do_sample=False)
    ref = model.generate(**enc, **kw)
    out = model.generate(**enc, **kw, assistant_model=drafter, adaptive_verification=False)
    stats = drafter.last_stats
    tree = model.generate(**enc, **kw, assistant_model=drafter, draft_tree_size=TREE_SIZE)
    same = torch.equal(out, ref) and torch.equal(tree, ref)
    print(
        f"1. Exactness (fp32, greedy, the math prompt, {CHECK_NEW_TOKENS} new tokens, {stats.verified_tokens} drafts "
        f"verified in {stats.steps} steps; again with a tree of {TREE_SIZE} drafts): DSpark's tokens are plain "
        f"generate()'s: {'yes' if same else 'NO'}"
    )
    if not same:
        print("   DSpark must be token-identical to plain generate() in fp32: please report this as a bug.")
    return same


def has_step_table(model) -> bool:
    """The scheduler prices steps with this device's step-time table: profile and cache it on first use."""
    path = local_table_path(TARGET, next(model.parameters()).device)
    repo = str(default_drafter())  # a drafter folder or Hub repo may ship tables under step_tables/
    if load_or_profile(model, drafter_repo=repo, target_id=TARGET, profile_if_missing=False) is not None:
        print(f"\nstep-time table for this device: {path}")
        return True
    print(flush=True)  # load_or_profile logs that it profiles (the target's forward at 1-512 tokens)
    t0 = time.perf_counter()
    try:
        load_or_profile(model, drafter_repo=repo, target_id=TARGET, profile_kwargs=PROFILE)
    except InvalidStepTableError as err:  # a flat curve: the scheduler could not tell costs apart
        print(f"no usable step-time table ({err}); verifying the full block instead")
        return False
    print(f"profiled the step-time table in {time.perf_counter() - t0:.0f} s, cached at {path} (generate() uses it "
          "from now on)")
    return True


def chat(tok, prompt: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)


def timed(fn) -> float:
    """Seconds one call of fn takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def medians_in_turn(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """The median seconds of each run over `repeats` rounds, every round calling the runs in turn (so a drifting
    machine weighs on all of them alike)."""
    seconds = {key: [] for key in runs}
    for _ in range(repeats):
        for key, run in runs.items():
            seconds[key].append(timed(run))
    return {key: statistics.median(s) for key, s in seconds.items()}


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The first position where two token sequences differ (a length difference counts), or None."""
    n = min(len(a), len(b))
    diff = (a[:n] != b[:n]).nonzero()
    if len(diff):
        return int(diff[0])
    return None if len(a) == len(b) else n


def name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def plot(accept: list[list[float]], taus: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path("outputs")
    out.mkdir(exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, acc, tau in zip(PROMPTS, accept, taus):
        ax.plot(range(1, len(acc) + 1), acc, "o-", label=f"{label} (tau {tau:.2f})")  # NaN (never verified): no point
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
