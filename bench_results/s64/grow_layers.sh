#!/bin/bash
# session 64: does capacity bind at the plateau? S7 grown to 3 and to 4 decoder layers (new layers from the target's
# last layers with zero output projections: they draft as S7 until trained), continued with accept_ab.sh's control
# command otherwise (same data, seed, lr, schedule minutes, one core each side by side); then greedy chain evals
set -uo pipefail
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=/work/runs/s64; S=/work/runs
MIN=${MIN:-55}
COMMON="--init $R/S7 --data $S/s59/data-mix,$S/s59/data-sd07,$S/s60/data-sd07,$S/s60/data-mix --eval-sequences 8 \
  --ce-label target --ce-weight 1.0 --batch-size 4 --num-anchors 128 --lr 2e-4 --ema-decay 0.998 --warmup-ratio 0.03 \
  --max-steps 100000 --schedule-minutes $MIN --time-budget-min $((MIN + 3)) --eval-every 300 --seed 64 --no-progress"
date; echo TRAIN START
for n in 3 4; do
  .venv/bin/hf-dspark train $COMMON --layers $n --out $R/L$n > $R/L$n.log 2>&1 &
done
wait
date; echo TRAIN DONE
for n in 3 4; do
  .venv/bin/hf-dspark eval-tau --drafter $R/L$n/drafter --sets gsm8k,humaneval,mtbench --num-prompts 40 \
    --max-new-tokens 128 --copy-ngram 0 --out $R/eval_L$n.json > $R/eval_L$n.log 2>&1 &
done
wait
date; echo DONE
