#!/bin/bash
# the draft vocabulary grown to 32,768 (arm V) against the same continuation of S7 as it is (arm C): same data, seed,
# lr, moving average and window, one core each, side by side
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=/work/runs/s61; S7=model_cards/dspark-smollm2-135m-instruct; H=.venv/bin/hf-dspark
DATA=/work/runs/s59/data-mix,/work/runs/s59/data-sd07,/work/runs/s60/data-mix,/work/runs/s60/data-sd07:2
ARGS="--data $DATA --ce-weight 1.0 --ce-label target --batch-size 4 --num-anchors 128 --warmup-ratio 0.03 --max-steps 100000 \
  --schedule-minutes 78 --time-budget-min 80 --eval-every 300 --eval-sequences 8 --no-progress --lr 2e-4 --ema-decay 0.998 --seed 61"
$H train --init $R/S7-V32 $ARGS --out $R/train-V > $R/train-V.log 2>&1 &
$H train --init $S7 $ARGS --out $R/train-C > $R/train-C.log 2>&1 &
wait; date; echo TRAIN DONE
