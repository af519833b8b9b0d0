#!/bin/bash
# session 58: a gated-head DSpark and its DFlash twin, fresh, side by side (one thread each), on ShareGPT as written
# (make-data --as-written: the target's labels from its forward), same init, seed, lr and minutes; only --dflash differs
set -euo pipefail
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=${R:-/work/runs/s58}  # holds data-aw/: hf-dspark make-data --as-written --prompts sharegpt --out $R/data-aw
MIN=${MIN:-90}
COMMON="--data $R/data-aw --eval-sequences 8 --layers 2 --draft-vocab-size 16384 --ce-weight 1.0 --ce-label target \
  --batch-size 4 --num-anchors 128 --lr 1e-3 --warmup-ratio 0.03 --max-steps 100000 --schedule-minutes $MIN \
  --time-budget-min $((MIN + 3)) --eval-every 400 --seed 58 --no-progress"
date; echo TRAIN START
.venv/bin/hf-dspark train $COMMON --markov-head-type gated --out $R/twin-gated > $R/twin-gated.log 2>&1 &
P1=$!
.venv/bin/hf-dspark train $COMMON --dflash --out $R/twin-dflash > $R/twin-dflash.log 2>&1 &
P2=$!
wait $P1 $P2
date; echo TRAIN DONE
for arm in gated dflash; do
  .venv/bin/hf-dspark eval-tau --drafter $R/twin-$arm/drafter --sets gsm8k,humaneval,mtbench --num-prompts 40 \
    --max-new-tokens 128 --copy-ngram 0 --out $R/eval_twin_$arm.json > $R/eval-$arm.log 2>&1 &
done
wait
date; echo DONE
