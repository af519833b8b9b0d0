#!/bin/bash
# a short continuation of S7 with --ema-decay 0.998 on session 60's data (S7 never saw it), one core: the run's last
# weights (from its checkpoint) against their moving average (its exported drafter), same trajectory
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=/work/runs/s60; S7=model_cards/dspark-smollm2-135m-instruct; H=.venv/bin/hf-dspark
$H train --init $S7 --data $R/data-mix,$R/data-sd07:2 --ce-weight 1.0 --ce-label target --batch-size 4 --num-anchors 128 \
  --warmup-ratio 0.03 --max-steps 100000 --schedule-minutes 30 --time-budget-min 32 --eval-every 200 --eval-sequences 8 \
  --no-progress --lr 2e-4 --ema-decay 0.998 --seed 63 --out $R/train-E > $R/train-E.log 2>&1
date; echo TRAIN-E DONE
