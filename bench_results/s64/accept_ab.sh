#!/bin/bash
# session 64: does the expected-acceptance loss (--accept-weight) beat the CE it replaces? Two continuations of S7
# side by side, one core each, same data, seed and schedule: control = KL + CE (target argmax, position weights) +
# BCE; accept = KL + ACC + BCE (ACC: 1 - the draft's probability of the block's greedy labels up to each slot).
# Then greedy chain evals with the drafts alone.
set -uo pipefail
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=/work/runs/s64; S=/work/runs
MIN=${MIN:-55}
COMMON="--init $R/S7 --data $S/s59/data-mix,$S/s59/data-sd07,$S/s60/data-sd07,$S/s60/data-mix --eval-sequences 8 \
  --ce-label target --batch-size 4 --num-anchors 128 --lr 2e-4 --ema-decay 0.998 --warmup-ratio 0.03 --max-steps 100000 \
  --schedule-minutes $MIN --time-budget-min $((MIN + 3)) --eval-every 300 --seed 64 --no-progress"
date; echo TRAIN START
.venv/bin/hf-dspark train $COMMON --ce-weight 1.0 --out $R/ctrl > $R/ctrl.log 2>&1 &
.venv/bin/hf-dspark train $COMMON --ce-weight 0.0 --accept-weight 1.0 --out $R/acc > $R/acc.log 2>&1 &
wait
date; echo TRAIN DONE
for arm in ctrl acc; do
  .venv/bin/hf-dspark eval-tau --drafter $R/$arm/drafter --sets gsm8k,humaneval,mtbench --num-prompts 40 \
    --max-new-tokens 128 --copy-ngram 0 --out $R/eval_$arm.json > $R/eval_$arm.log 2>&1 &
done
wait
date; echo DONE
