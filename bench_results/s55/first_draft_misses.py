"""Where a drafter's first drafts fail (bench_results/s55/README.md): the target's greedy answers to the first N prompts
of an eval set, every answer position a teacher-forced anchor, read the way greedy decoding reads them
(`replayed_decoding`). Prints the first draft's acceptance by the target's top-1 probability of the token it drafts,
the confident misses (p >= 0.9) with their context, and the answer tokens outside the draft vocabulary.

    python bench_results/s55/first_draft_misses.py gsm8k 20 model_cards/dspark-smollm2-135m-instruct
"""
import sys, torch
from hf_dspark import DSparkDrafter
from hf_dspark.targets import load_target
from hf_dspark.training.evaluate import eval_set, chat_inputs
from hf_dspark.training.data import target_hidden
from hf_dspark.training.trainer import draft_slot_logits, draft_labels
from hf_dspark.training.packing import sample_anchors
from hf_dspark.training.losses import replayed_decoding

name, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
target, tok = load_target("smollm2-135m-instruct", dtype="bfloat16")
drafter = DSparkDrafter.from_pretrained(path).to(torch.bfloat16).eval().bind(target)
bins = [0, 0.3, 0.5, 0.7, 0.9, 0.99, 1.01]
rows = []  # per visited anchor: (p1 of target at first drafted pos, margin, first-slot match, top5 hit, accepted len)
allrows = []
examples = []
oov_tokens=[0,0]; miss_oov=[0,0]; ended_oov=[0,0]
for p in eval_set(name, n):
    enc = chat_inputs(tok, [p])
    with torch.no_grad():
        out = target.generate(**enc, max_new_tokens=128, do_sample=False)
        ids = out[:, :]  # [1, T]
        plen = enc["input_ids"].shape[1]
        lm = torch.zeros_like(ids[0], dtype=torch.bool); lm[plen:] = True
        taps, final = target_hidden(target, ids, drafter.tap_hidden_state_ids)
        logits = target.lm_head(final).float()[0]  # [T, V]
        probs = logits.softmax(-1)
        top2 = probs.topk(2, dim=-1).values  # [T, 2]
        anchors = sample_anchors(lm, 1 << 30)
        # greedy data: the label at t+1 is argmax of logits at t (check)
        agree = (logits[plen - 1:-1].argmax(-1) == ids[0, plen:]).float().mean().item()
        draft, _, packed, where = draft_slot_logits(drafter, taps, ids, lm[None], anchors[None])
        labels = draft_labels(drafter, packed.labels[where])
        match = torch.zeros_like(packed.valid)
        match[where] = draft.argmax(-1) == labels
        top5 = torch.zeros_like(packed.valid)
        top5[where] = (draft.topk(5, -1).indices == labels[:, None]).any(-1)
        visited, lengths = replayed_decoding(anchors, match[0], packed.valid[0])
        a_index = {int(a): i for i, a in enumerate(anchors.tolist())}
        for v, L in zip(visited, lengths):
            i = a_index[v]
            # the first draft predicts token v+2 from anchor token v+1? anchor p: block x_p (known), drafts x_{p+1..}
            # label x_{p+1} = argmax of target logits at position p
            rows.append((float(top2[v, 0]), float(top2[v, 0] - top2[v, 1]), bool(match[0, i, 0]), bool(top5[0, i, 0]), L))
            if float(top2[v, 0]) >= 0.9 and not match[0, i, 0] and len(examples) < 40:
                lab = int(packed.labels[0, i, 0]); dl = int(draft_labels(drafter, packed.labels[0, i, 0:1])[0])
                # the drafter's pick (row of where for this anchor, slot 0)
                k = ((where[1] == i) & (where[2] == 0)).nonzero()[0, 0]
                pick = int(draft[k].argmax()); pick_t = int(drafter.draft_target_ids()[pick])
                examples.append((tok.decode(ids[0, max(plen, v - 12):v + 1]), tok.decode([lab]), dl, tok.decode([pick_t]), float(top2[v, 0])))
        t2d = drafter.target_to_draft()
        resp = ids[0, plen:]
        oov_tokens[0] += int((t2d[resp] < 0).sum()); oov_tokens[1] += resp.numel()
        for v, L in zip(visited, lengths):
            i = a_index[v]
            if not match[0, i, 0]:
                miss_oov[1] += 1; miss_oov[0] += int(t2d[ids[0, v + 1]] < 0)
            # a block ended by an OOV label within its accepted run + 1
            end = v + L  # the position of the target token that replaced the first rejected draft
            if L < drafter.config.block_size + 1 and end < ids.shape[1] and t2d[ids[0, end]] < 0:
                ended_oov[0] += 1
            ended_oov[1] += 1
        for i, a in enumerate(anchors.tolist()):
            if packed.valid[0, i, 0]:
                allrows.append((float(top2[a, 0]), bool(match[0, i, 0])))
print(f"{name}: {n} prompts, target greedy self-agreement {agree:.3f}, visited blocks {len(rows)}, replayed tau {sum(r[4] for r in rows)/len(rows):.3f}")
print("first draft at visited anchors, by the target's top-1 prob at that position:")
print(f"{'p1 bin':>12} {'share':>6} {'acc':>6} {'top5':>6} {'share of misses':>16}")
miss = sum(1 for r in rows if not r[2])
for lo, hi in zip(bins[:-1], bins[1:]):
    sel = [r for r in rows if lo <= r[0] < hi]
    if not sel: continue
    acc = sum(r[2] for r in sel) / len(sel); t5 = sum(r[3] for r in sel) / len(sel)
    m = sum(1 for r in sel if not r[2])
    print(f"[{lo:.2f},{min(hi,1):.2f}) {len(sel)/len(rows):6.3f} {acc:6.3f} {t5:6.3f} {m/miss:16.3f}")
print(f"all response positions: mean p1 {sum(r[0] for r in allrows)/len(allrows):.3f}, first-draft acc {sum(r[1] for r in allrows)/len(allrows):.3f}")
print(f"visited: mean p1 {sum(r[0] for r in rows)/len(rows):.3f}, first-draft acc {sum(r[2] for r in rows)/len(rows):.3f}")
oov = sum(1 for e in examples if e[2] < 0)
print(f"confident misses shown {len(examples)}, label outside the draft vocabulary {oov}")
for e in examples: print(repr(e[0][-60:]), '->', repr(e[1]), 'drafted', repr(e[3]), f"p1={e[4]:.3f}", 'OOV' if e[2] < 0 else '')
print(f"OOV response tokens {oov_tokens[0]}/{oov_tokens[1]} = {oov_tokens[0]/oov_tokens[1]:.4f}; first-draft misses at visited anchors that are OOV {miss_oov[0]}/{miss_oov[1]}; blocks ended by an OOV token {ended_oov[0]}/{ended_oov[1]}")
