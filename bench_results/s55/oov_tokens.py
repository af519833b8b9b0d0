"""The target's greedy answers to 20 prompts per eval set: how many of their tokens lie outside the shipped drafter's
draft vocabulary, and of those how many occur in the training data of sessions 50-53 (the self-distilled answers
S6's members and session 53's runs trained on; regenerable, not in git) and earlier in the prompt or answer.

    python bench_results/s55/oov_tokens.py
"""
import glob, json, torch
from safetensors.torch import load_file
from hf_dspark import DSparkDrafter
from hf_dspark.targets import load_target
from hf_dspark.training.evaluate import eval_set, chat_inputs
target, tok = load_target("smollm2-135m-instruct", dtype="bfloat16")
V = target.config.vocab_size
counts = torch.zeros(V, dtype=torch.long)
for d in ["s50/data-m50", "s50/data-m51", "s51/data-wp510-t0", "s51/data-wp510-t0.7", "s53/data-m53", "s53/data-lt53"]:
    for f in sorted(glob.glob(f"/work/runs/{d}/shard-*.safetensors")):
        s = load_file(f)
        counts += torch.bincount(s["input_ids"][s["loss_mask"].bool()], minlength=V)
print("distinct response tokens in the data", int((counts > 0).sum()), "of", V)
d = DSparkDrafter.from_pretrained("/work/main/model_cards/dspark-smollm2-135m-instruct")
t2d = d.target_to_draft()
for name in ["gsm8k", "humaneval", "mtbench"]:
    tot = oov = in_data = in_data5 = in_prompt = 0
    for p in eval_set(name, 20):
        enc = chat_inputs(tok, [p])
        out = target.generate(**enc, max_new_tokens=128, do_sample=False)[0]
        plen = enc["input_ids"].shape[1]
        prompt = set(out[:plen].tolist())
        resp = out[plen:].tolist()
        for j, t in enumerate(resp):
            tot += 1
            if t2d[t] < 0:
                oov += 1; in_data += counts[t] > 0; in_data5 += counts[t] >= 5
                in_prompt += (t in prompt) or (t in resp[:j])
    print(f"{name}: OOV {oov}/{tot}; of those in the data {int(in_data)} (>=5 times {int(in_data5)}), earlier in prompt/answer {in_prompt}")
