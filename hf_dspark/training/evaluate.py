"""Held-out measurement with the real decoding loop: tau per eval set, and calibration data collection.

`measure(drafter, target, tok, prompts)` runs `target.generate(custom_generate=hf_dspark.generate)` greedily,
verifying the full block (no scheduler), and returns tau (mean accepted length incl. the bonus token), the
per-position acceptance and the per-step confidence logits / accepted / verified counts for calibration.
"""

from __future__ import annotations

from typing import Collection

import torch
from transformers import PreTrainedModel

from ..modeling import DSparkDrafter
from .data import decontaminate, eval_prompts, last_of_shuffle, read_prompts

EVAL_SETS = ("gsm8k", "humaneval", "mtbench")


def chat_inputs(tokenizer, prompts: list[str]) -> dict[str, torch.Tensor]:
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False) for p in prompts]
    return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)


HELDOUT_POOL = 256
"""The held-out ShareGPT prompts are the last 256 first turns of make-data's seeded shuffle: `eval-tau --sets heldout`
and `calibrate` take theirs from this tail, and training data built from whole conversations leaves these out
(`drop_heldout_conversations`)."""


def heldout_prompts(n: int, seed: int = 0, source: str = "sharegpt") -> list[str]:
    """Prompts never used by make-data runs with --max-prompts below len - n: the last n of the same seeded
    shuffle make-data uses (after decontamination)."""
    prompts, _ = decontaminate(read_prompts(source))
    return last_of_shuffle(prompts, n, seed)


def drop_heldout_conversations(conversations: list[list[dict]], held: Collection[str] | None = None) -> list[list[dict]]:
    """The conversations less those that open with a held-out prompt (`held`; by default the HELDOUT_POOL held-out
    ShareGPT prompts): make-data --later-turns and --as-written train on every turn of what is left."""
    held = set(heldout_prompts(HELDOUT_POOL) if held is None else held)
    return [conv for conv in conversations if conv[0]["content"] not in held]


def eval_set(name: str, n: int) -> list[str]:
    """The first n prompts of an evaluation set (gsm8k, humaneval, mtbench first turns)."""
    sets = eval_prompts()
    if name not in sets:
        raise ValueError(f"Unknown eval set {name!r}; use one of {', '.join(sets)}.")
    return sets[name][:n]


@torch.no_grad()
def measure(
    drafter: DSparkDrafter | object,
    target: PreTrainedModel,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int = 128,
    batch_size: int = 1,
    markov: bool = True,
    draft_tree_size: int | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    prompt_lookup_num_tokens: int | None = None,
    copy_ngram: int | None = None,
) -> dict:
    """DSpark decoding over `prompts` (a chain of drafts, or a tree of `draft_tree_size`; with a prompt-lookup
    branch of `prompt_lookup_num_tokens`), greedy, or sampled at `temperature` > 0 (seeded, with the target's
    generation config otherwise), copying with `copy_ngram` (None: generate()'s default); returns tau,
    per-position acceptance, the steps and committed tokens of each `generate()` call (each prompt's at `batch_size` 1, for paired comparisons) and calibration samples (none for a
    tree)."""
    import hf_dspark

    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}.")
    sampling = dict(do_sample=True, temperature=temperature) if temperature > 0 else dict(do_sample=False)
    torch.manual_seed(seed)

    accepted, verified_lens = [], []
    steps_per_call, tokens_per_call = [], []  # one entry per generate() call: per prompt at batch_size 1
    conf, num_acc, num_ver = [], [], []
    for i in range(0, len(prompts), batch_size):
        enc = chat_inputs(tokenizer, prompts[i : i + batch_size])
        target.generate(
            **enc,
            custom_generate=hf_dspark.generate,
            drafter=drafter,
            max_new_tokens=max_new_tokens,
            **sampling,
            adaptive_verification=False,
            markov=markov,
            draft_tree_size=draft_tree_size,
            prompt_lookup_num_tokens=prompt_lookup_num_tokens,
            copy_ngram=copy_ngram,
        )
        base = drafter if isinstance(drafter, DSparkDrafter) else drafter.base_model.model
        st = base.last_stats
        accepted += st.accepted_lengths
        verified_lens += st.verified_lengths
        steps_per_call.append(len(st.accepted_lengths))
        tokens_per_call.append(sum(st.accepted_lengths))
        for c, a, v in zip(st.conf_logits, st.num_accepted, st.num_verified):
            if c is not None:
                conf.append(c.float().cpu())
                num_acc.append(a.cpu())
                num_ver.append(v.cpu())
    b = (drafter if isinstance(drafter, DSparkDrafter) else drafter.base_model.model).config.block_size
    per_pos = []
    for k in range(b):
        tried = sum(1 for a, l in zip(accepted, verified_lens) if a - 1 >= k and l > k)
        ok = sum(1 for a in accepted if a - 1 >= k + 1)
        per_pos.append(ok / tried if tried else None)  # None: never reached (JSON null)
    return {
        "tau": sum(accepted) / max(1, len(accepted)),
        "per_position_acceptance": per_pos,
        "steps": len(accepted),
        "num_prompts": len(prompts),
        "steps_per_call": steps_per_call,
        "tokens_per_call": tokens_per_call,
        "conf_logits": torch.cat(conf) if conf else torch.zeros(0, b),
        "num_accepted": torch.cat(num_acc) if num_acc else torch.zeros(0, dtype=torch.long),
        "num_verified": torch.cat(num_ver) if num_ver else torch.zeros(0, dtype=torch.long),
    }
