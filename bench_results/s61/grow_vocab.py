"""S7 with its draft vocabulary grown from 16,384 to SIZE tokens: the current ones plus the most frequent others of
sessions 58-60's data (vocab_cov.py's counts.pt); new lm_head rows = a least-squares affine map (fitted on the kept
rows) of the target's rows, or with --raw the target's rows as they are (the old remap_draft_vocab).
Usage: grow_vocab.py SIZE OUT [--raw]"""
import sys, torch
from hf_dspark import DSparkDrafter
from hf_dspark.targets import load_target
from hf_dspark.training.trainer import remap_draft_vocab
size, out, raw = int(sys.argv[1]), sys.argv[2], "--raw" in sys.argv[3:]
target, _ = load_target("smollm2-135m-instruct", dtype="float32")
d = DSparkDrafter.from_pretrained("/work/main/model_cards/dspark-smollm2-135m-instruct", target=target).float()
cur = d.draft_target_ids().cpu()
counts = torch.load("/work/runs/s61/counts.pt")
counts[cur] = -1
extra = counts.argsort(descending=True)[: size - cur.numel()]
assert (counts[extra] > 0).all()
ids = torch.cat([cur, extra]).sort().values
with torch.no_grad():
    new = remap_draft_vocab(d, target, ids)  # kept rows as trained (new rows: overwritten below)
    T = target.get_output_embeddings().weight.float()
    A = torch.cat([T[cur], torch.ones(cur.numel(), 1)], 1)
    M = torch.linalg.solve(A.T @ A + torch.eye(A.shape[1]), A.T @ d.lm_head.weight.float())
    isnew = ~torch.isin(ids, cur)
    if raw:  # what remap_draft_vocab did before this session
        new.lm_head.weight[isnew] = T[ids[isnew]]
    else:  # as the run used it (remap_draft_vocab's map now differs only in its ridge)
        new.lm_head.weight[isnew] = torch.cat([T[ids[isnew]], torch.ones(int(isnew.sum()), 1)], 1) @ M
    # kept rows must be bit-identical
    where = {int(t): i for i, t in enumerate(cur.tolist())}
    k = [i for i, t in enumerate(ids.tolist()) if t in where]
    assert torch.equal(new.lm_head.weight[k], d.lm_head.weight.float()[[where[int(ids[i])] for i in k]])
new.to(torch.bfloat16).save_pretrained(out)
print("saved", out, new.draft_vocab_size, "new rows", int(isnew.sum()))
