#!/bin/bash
# held-out tau_tf / replayed on 64 of session 60's greedy answers (S7 never trained on them), no training step
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
R=/work/runs/s62; H=.venv/bin/hf-dspark
for d in "$@"; do
  $H train --init $R/$d --data /work/runs/s60/data-mix --eval-sequences 64 --max-steps 0 --no-progress --out $R/probe-$(basename $d) > $R/probe-$(basename $d).log 2>&1
  python -c "import json;h=json.load(open('$R/probe-$(basename $d)/history.json'))[-1];print('$(basename $d)', round(h['eval_tau_tf'],4), round(h['eval_tau_replay'],4))"
done
