import torch
from safetensors.torch import load_file
from hf_dspark.targets import load_target
model, tok = load_target("smollm2-135m-instruct", dtype="float32")
w = load_file("model_cards/dspark-smollm2-135m-instruct/model.safetensors")
d2t = w["d2t"].long(); ids = torch.arange(d2t.numel()) + d2t
T = model.get_output_embeddings().weight.float()[ids]; D = w["lm_head.weight"].float()
cos = torch.nn.functional.cosine_similarity(T, D, dim=1)
print("cos quantiles", cos.quantile(torch.tensor([.05,.25,.5,.75,.95])))
print("norm ratio D/T quantiles", (D.norm(dim=1)/T.norm(dim=1)).quantile(torch.tensor([.05,.25,.5,.75,.95])))
# best linear map? least squares scalar
print("lsq scalar", (T*D).sum()/(T*T).sum())
