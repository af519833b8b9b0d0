#!/bin/bash
# session 54: the DFlash twin at ~3.5x session 25's budget. Two fresh 2-layer drafters trained side by side
# (one thread each) from the same target-layer init, on the same data (the self-distilled answers of sessions
# 50-53, with the target's states cached), seed and minutes; the only difference is --dflash.
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository root; data directories from make-data under /work/runs
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=/work/runs
DATA=$R/s50/data-m50,$R/s50/data-m51,$R/s51/data-wp510-t0,$R/s51/data-wp510-t0.7,$R/s53/data-lt53,$R/s53/data-m53
MIN=${MIN:-110}
COMMON="--data $DATA --eval-sequences 8 --layers 2 --draft-vocab-size 16384 --ce-weight 1.0 --ce-label target \
  --batch-size 4 --num-anchors 128 --lr 1e-3 --warmup-ratio 0.03 --max-steps 100000 --schedule-minutes $MIN \
  --time-budget-min $((MIN + 3)) --eval-every 400 --seed 54 --no-progress"
date; echo TRAIN START
.venv/bin/hf-dspark train $COMMON --out $R/s54/twin-dspark > $R/s54/twin-dspark.log 2>&1 &
P1=$!
.venv/bin/hf-dspark train $COMMON --dflash --out $R/s54/twin-dflash > $R/s54/twin-dflash.log 2>&1 &
P2=$!
wait $P1 $P2
date; echo TRAIN DONE
for arm in dspark dflash; do
  OMP_NUM_THREADS=1 .venv/bin/hf-dspark eval-tau --drafter $R/s54/twin-$arm/drafter --sets gsm8k,humaneval,mtbench \
    --num-prompts 40 --max-new-tokens 128 --out $R/s54/eval_twin_$arm.json > $R/s54/eval-$arm.log 2>&1 &
done
wait
date; echo DONE
