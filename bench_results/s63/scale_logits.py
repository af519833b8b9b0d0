"""Write a copy of a drafter whose draft logits are divided by TAU (lm_head and the Markov head's W2 scaled by 1 / TAU):
its argmax, so its greedy chain, is unchanged; its sampled distribution q is q at temperature TAU."""
import shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file

src, tau, out = Path(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])
shutil.copytree(src, out, dirs_exist_ok=True)
sd = load_file(src / "model.safetensors")
for key in ("lm_head.weight", "markov_head.markov_w2.weight"):
    if key in sd:
        sd[key] = (sd[key].float() / tau).to(sd[key].dtype)
        print(out, key, "/", tau)
save_file(sd, out / "model.safetensors", metadata={"format": "pt"})
