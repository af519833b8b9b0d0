"""Write a copy of a drafter with its Markov head's bias scaled by ALPHA (markov_w2 *= ALPHA), nothing else changed."""
import shutil, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file

src, alpha, out = Path(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])
shutil.copytree(src, out, dirs_exist_ok=True)
sd = load_file(src / "model.safetensors")
key = "markov_head.markov_w2.weight"
assert key in sd, sorted(sd)
sd[key] = (sd[key].float() * alpha).to(sd[key].dtype)
save_file(sd, out / "model.safetensors", metadata={"format": "pt"})
print(out, key, sd[key].dtype, tuple(sd[key].shape))
