"""Session 35's prompt file: ShareGPT's later user turns (make-data --later-turns) whose chat-templated prompt has
384-768 tokens, as JSONL {"messages": [...]} lines for `hf-dspark make-data --prompts`.

    python bench_results/s35/later_turn_prompts_384_768.py runs/lt-mid.jsonl
"""
import collections
import json
import sys

from hf_dspark.targets import load_target
from hf_dspark.training.data import _chat_ids, decontaminate, later_turn_prompts, read_conversations

out = sys.argv[1] if len(sys.argv) > 1 else "runs/lt-mid.jsonl"
_, tok = load_target("smollm2-135m-instruct", dtype="bfloat16")
prompts, dropped = decontaminate(later_turn_prompts(read_conversations("sharegpt")))
lens = [len(_chat_ids(tok, p, None)) for p in prompts]
print(f"{len(prompts)} later turns ({dropped} dropped as eval-like); prompt tokens by 128s:",
      sorted(collections.Counter(min(n // 128, 12) for n in lens).items()))
keep = [p for p, n in zip(prompts, lens) if 384 < n <= 768]
with open(out, "w") as f:
    for p in keep:
        f.write(json.dumps({"messages": p}) + "\n")
print(f"{out}: {len(keep)} prompts of 385-768 tokens")
