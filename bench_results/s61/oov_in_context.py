import torch
from safetensors.torch import load_file
from hf_dspark.targets import load_target
from hf_dspark.training.evaluate import chat_inputs, eval_set
torch.set_num_threads(2)
model, tok = load_target("smollm2-135m-instruct", dtype="bfloat16")
w = load_file("model_cards/dspark-smollm2-135m-instruct/model.safetensors")
print({k: tuple(v.shape) for k, v in w.items() if 'head' in k or 'embed' in k})
d2t = w["d2t"].long(); ids = torch.arange(d2t.numel()) + d2t
mark = torch.zeros(49152, dtype=torch.bool); mark[ids] = True
for s in ["gsm8k", "humaneval", "mtbench"]:
    n = inp = inctx = tot = 0
    prompts = eval_set(s, 40)
    for i in range(0, 40, 20):
        enc = chat_inputs(tok, prompts[i:i+20])
        out = model.generate(**enc, max_new_tokens=128, do_sample=False)
        P = enc["input_ids"].shape[1]
        for r, row in enumerate(out.tolist()):
            prompt = set(row[:P]); gen = row[P:]
            if 2 in gen: gen = gen[:gen.index(2)]
            for j, t in enumerate(gen):
                tot += 1
                if not mark[t]:
                    n += 1; inp += t in prompt; inctx += t in prompt or t in gen[:j]
    print(s, "oov", n / tot, "in prompt", inp / n, "in prompt or earlier output", inctx / n, flush=True)
