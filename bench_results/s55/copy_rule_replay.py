"""Copy rules replayed on the target's greedy answers (bench_results/s55/README.md).

For the first N prompts of an eval set: the target's greedy answer (bf16, 128 new tokens), the drafter's teacher-forced
drafts at every answer position (what its chain drafts there while the drafts before are right), then greedy decoding
replayed on them (a block starts where the previous one stopped). A rule overrides a slot's draft with the token that
followed the latest earlier occurrence of the last m tokens (the answer so far and the block's drafts, the prompt
included), for the first m of its list that matches; "oov" entries only when that token is outside the draft vocabulary;
"first" takes the first occurrence instead. Prints the replayed tau per rule.

    python bench_results/s55/copy_rule_replay.py gsm8k 20 model_cards/dspark-smollm2-135m-instruct [RULE,RULE...]

"p<g" rules copy only where the drafter's own pick has probability below g.
"""

import sys

import torch

from hf_dspark import DSparkDrafter
from hf_dspark.targets import load_target
from hf_dspark.training.data import target_hidden
from hf_dspark.training.evaluate import chat_inputs, eval_set
from hf_dspark.training.losses import replayed_decoding
from hf_dspark.training.packing import sample_anchors
from hf_dspark.training.trainer import draft_labels, draft_slot_logits

ANY, OOV = False, True
RULES = {  # name -> [(m, outside the draft vocabulary only, first occurrence)], tried in order
    "drafter": [],
    "any3": [(3, ANY, False)],
    "any3 first": [(3, ANY, True)],
    "any2": [(2, ANY, False)],
    "any4..3": [(m, ANY, False) for m in (4, 3)],
    "any5..3": [(m, ANY, False) for m in (5, 4, 3)],
    "any6..3": [(m, ANY, False) for m in (6, 5, 4, 3)],
    "any8..3": [(m, ANY, False) for m in range(8, 2, -1)],
    "any8..4": [(m, ANY, False) for m in range(8, 3, -1)],
    "any3|oov2": [(3, ANY, False), (2, OOV, False)],
    "any3|oov1": [(3, ANY, False), (1, OOV, False)],
    "any4,3|oov2": [(4, ANY, False), (3, ANY, False), (2, OOV, False)],
    "oov1": [(1, OOV, False)], "oov2": [(2, OOV, False)], "oov3": [(3, OOV, False)],
}
RULES["8..3 no digits"] = RULES["any8..3"]
GATES = {}  # rule -> copy only where the drafter's own pick has probability below this
for g in (0.3, 0.5, 0.7, 0.8, 0.9):
    RULES[f"8..3 p<{g}"] = RULES["any8..3"]
    GATES[f"8..3 p<{g}"] = g
if len(sys.argv) > 4:  # a comma list of the rules to run
    RULES = {k: v for k, v in RULES.items() if k in sys.argv[4].split(",")}


def lookup(seq: list[int], end: int, m: int, first: bool) -> int | None:
    """The token after the latest (or first) occurrence of seq[end - m:end] within seq[:end], None if none."""
    if end < m + 1:
        return None
    pattern = seq[end - m : end]
    for j in range(0, end - m) if first else range(end - m - 1, -1, -1):
        if seq[j : j + m] == pattern:
            return seq[j + m]
    return None


def main(name: str, num_prompts: int, path: str) -> None:
    target, tok = load_target("smollm2-135m-instruct", dtype="bfloat16")
    drafter = DSparkDrafter.from_pretrained(path).to(torch.bfloat16).eval().bind(target)
    t2d, block = drafter.target_to_draft(), drafter.config.block_size
    digits = {t for t in range(len(tok)) if tok.decode([t]).strip().isdigit()}
    totals = {rule: [0, 0] for rule in RULES}
    for prompt in eval_set(name, num_prompts):
        enc = chat_inputs(tok, [prompt])
        with torch.no_grad():
            ids = target.generate(**enc, max_new_tokens=128, do_sample=False)  # [1, T]
            answer = torch.zeros_like(ids[0], dtype=torch.bool)
            answer[enc["input_ids"].shape[1] :] = True
            taps, _ = target_hidden(target, ids, drafter.tap_hidden_state_ids)
            anchors = sample_anchors(answer, 1 << 30)  # every answer position
            draft, _, packed, where = draft_slot_logits(drafter, taps, ids, answer[None], anchors[None])
            match = torch.zeros_like(packed.valid)  # [1, M, B]
            match[where] = draft.argmax(-1) == draft_labels(drafter, packed.labels[where])
            sure = torch.zeros(packed.valid.shape, dtype=torch.float)  # [1, M, B] the drafter's p of its own pick
            sure[where] = draft.float().softmax(-1).amax(-1)
        seq, valid = ids[0].tolist(), packed.valid[0]
        for rule, steps in RULES.items():
            gate = GATES.get(rule, 2.0)
            m = match[0].clone()
            for i, a in enumerate(anchors.tolist()):
                for k in range(block):
                    if not valid[i, k]:
                        break
                    if sure[0, i, k] >= gate:  # the drafter is sure enough of its own pick
                        continue
                    end = a + 1 + k  # slot k drafts seq[end]; seq[:end] is known (right drafts before it)
                    for size, oov_only, first in steps:
                        y = lookup(seq, end, size, first)
                        if y is not None and rule.endswith("no digits") and y in digits:
                            break  # a number's digits are left to the drafter
                        if y is not None and (not oov_only or t2d[y] < 0):
                            m[i, k] = y == seq[end]
                            break
            _, lengths = replayed_decoding(anchors, m, valid)
            totals[rule][0] += sum(lengths)
            totals[rule][1] += len(lengths)
    for rule, (tokens, blocks) in totals.items():
        print(f"{name} {rule:>12}: replayed tau {tokens / blocks:.3f} ({blocks} blocks)")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
