#!/bin/bash
# held-out tau_tf / replayed / soft acceptance (sum min(p, q) at T = 1) on the last 64 sequences of DATA (default:
# session 60's greedy answers, which S7 never trained on), no training step; TAG names the probe directories
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
R=/work/runs/s63; H=.venv/bin/hf-dspark
for d in "$@"; do
  n=$(basename $d)
  $H train --init $d --data ${DATA:-/work/runs/s60/data-mix} --eval-sequences 64 --max-steps 0 --no-progress --out $R/probe${TAG:-}-$n > $R/probe${TAG:-}-$n.log 2>&1
  .venv/bin/python -c "import json;h=json.load(open('$R/probe${TAG:-}-$n/history.json'))[-1];print('$n', round(h['eval_tau_tf'],4), round(h['eval_tau_replay'],4), round(h['eval_soft_accept'],4))"
done
