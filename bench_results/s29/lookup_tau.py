import sys, torch, time
torch.set_num_threads(1)
import hf_dspark
from hf_dspark import DSparkDrafter
from hf_dspark.bench import default_drafter
from hf_dspark.targets import load_target
from hf_dspark.training.evaluate import eval_set, chat_inputs
model, tok = load_target("smollm2-135m-instruct", dtype=torch.float32)
d = DSparkDrafter.from_pretrained(default_drafter(), target=model)
n = int(sys.argv[1])
variants = [dict(draft_tree_size=7), dict(draft_tree_size=7, prompt_lookup_num_tokens=7), dict(prompt_lookup_num_tokens=7),
            dict(draft_tree_size=4, prompt_lookup_num_tokens=7), dict(draft_tree_size=7, prompt_lookup_num_tokens=10),
            dict(draft_tree_size=7, prompt_lookup_num_tokens=7, max_matching_ngram_size=4)]
for name in sys.argv[2].split(","):
    prompts = eval_set(name, n)
    for kw in variants:
        acc = ver = 0; steps = 0
        for p in prompts:
            enc = chat_inputs(tok, [p])
            ref = None
            model.generate(**enc, max_new_tokens=128, do_sample=False, assistant_model=d, adaptive_verification=False if "draft_tree_size" not in kw and "prompt_lookup_num_tokens" not in kw else None, **kw)
            st = d.last_stats
            acc += sum(st.accepted_lengths); ver += sum(st.verified_lengths); steps += len(st.accepted_lengths)
        print(f"{name} {kw}: tau {acc/steps:.3f}, verified per step {ver/steps:.2f}", flush=True)
