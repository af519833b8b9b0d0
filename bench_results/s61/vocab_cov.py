import torch, glob, json
from safetensors.torch import load_file
from hf_dspark.targets import load_target
from hf_dspark.training.evaluate import chat_inputs, eval_set
counts = torch.zeros(49152, dtype=torch.long)
for d in ["/work/runs/s59/data-mix", "/work/runs/s59/data-sd07", "/work/runs/s60/data-mix", "/work/runs/s60/data-sd07", "/work/runs/s58/data-aw"]:
    for f in sorted(glob.glob(d + "/shard-*.safetensors")):
        if "cache" in f: continue
        t = load_file(f); ids = t["input_ids"].long()[t["loss_mask"].bool()]
        counts += torch.bincount(ids, minlength=49152)
print("response tokens", counts.sum().item(), "distinct", (counts > 0).sum().item())
torch.save(counts, "/work/runs/s61/counts.pt")
torch.set_num_threads(2)
model, tok = load_target("smollm2-135m-instruct", dtype="bfloat16")
w = load_file("/work/main/model_cards/dspark-smollm2-135m-instruct/model.safetensors")
cur = torch.zeros(49152, dtype=torch.bool); cur[torch.arange(w["d2t"].numel()) + w["d2t"].long()] = True
outs = {}
for s in ["gsm8k", "humaneval", "mtbench"]:
    toks = []
    prompts = eval_set(s, 40)
    for i in range(0, 40, 20):
        enc = chat_inputs(tok, prompts[i:i+20])
        out = model.generate(**enc, max_new_tokens=128, do_sample=False)
        for row in out[:, enc["input_ids"].shape[1]:].tolist():
            if 2 in row: row = row[:row.index(2) + 1]
            toks += row
    outs[s] = toks
json.dump(outs, open("/work/runs/s61/eval_outputs.json", "w"))
order = counts.argsort(descending=True)
for K in [16384, 24576, 32768, 40000]:
    m = torch.zeros(49152, dtype=torch.bool); m[order[:K]] = True
    row = {s: round(float((~m[torch.tensor(t)]).float().mean()), 4) for s, t in outs.items()}
    print(K, "top-K of this data", row)
K = 16384
print("current", {s: round(float((~cur[torch.tensor(t)]).float().mean()), 4) for s, t in outs.items()})
for K in [24576, 32768]:
    m = cur.clone(); extra = [i for i in order.tolist() if not cur[i]][:K - 16384]; m[extra] = True
    print("current +", K - 16384, {s: round(float((~m[torch.tensor(t)]).float().mean()), 4) for s, t in outs.items()})
