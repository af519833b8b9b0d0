"""Calibration of the datastore experiment's shares (needs datastore_experiment.patch applied): a table from one make-data
directory, its one-token proposals scored on the answers of another.

    python bench_results/s43/datastore_calibration.py runs/s43/sg1 runs/s43/sg2
"""
import glob, sys, math, collections
import numpy as np
from safetensors.torch import load_file
from hf_dspark.datastore import NgramDatastore
def seqs(d):
    out = []
    for f in sorted(glob.glob(f"{d}/shard-*.safetensors")):
        t = load_file(f); ids = t["input_ids"].numpy(); m = t["loss_mask"].numpy(); off = t["offsets"].tolist()
        out += [(ids[off[s]:off[s+1]], m[off[s]:off[s+1]]) for s in range(len(off)-1)]
    return out
train = seqs(sys.argv[1]); test = seqs(sys.argv[2])[:300]
store = NgramDatastore.build(train, 49152, 4)
print("train tokens", store.num_tokens)
b = collections.defaultdict(lambda: [0, 0]); byn = collections.defaultdict(lambda: [0, 0])
for ids, m in test:
    ids = ids.tolist()
    for i in range(4, len(ids)):
        if not m[i]: continue
        ctx = ids[i-4:i]
        for n, t in store.tables.items():
            key = 0
            for x in ctx[-n:]: key = key * 49152 + x
            j = int(np.searchsorted(t.keys, key))
            if j < t.keys.size and t.keys[j] == key:
                lp = float(t.logprobs[j]); ok = int(t.tokens[j]) == ids[i]
                bucket = min(9, int(math.exp(lp) * 10))
                b[bucket][0] += 1; b[bucket][1] += ok; byn[n][0] += 1; byn[n][1] += ok
                break
        else:
            byn[0][0] += 1
for k in sorted(b): print(f"claimed {k/10:.1f}-{(k+1)/10:.1f}: n={b[k][0]:6d} accuracy {b[k][1]/b[k][0]:.3f}")
for k in sorted(byn): print(f"context n={k}: {byn[k][0]} hits, accuracy {byn[k][1]/max(1,byn[k][0]):.3f}")
