#!/bin/bash
# session 57: S6 grown to a gated Markov head, on session 53's run-B recipe (same data, seed, lr, minutes, one thread)
set -euo pipefail
cd /work/main
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
date; echo START
.venv/bin/hf-dspark train --data /work/runs/s53/data-m53:2,/work/runs/s51/data-wp510-t0 \
    --init model_cards/dspark-smollm2-135m-instruct --markov-head-type gated --ce-weight 1.0 --ce-label target --batch-size 4 \
    --num-anchors 128 --lr 1e-4 --seed 54 --warmup-ratio 0.03 --max-steps 100000 --schedule-minutes 55 \
    --time-budget-min 58 --eval-every 200 --eval-sequences 8 --no-progress --out /work/runs/s57/train-Bg
date; echo TRAINED
bash /work/runs/s53/eval.sh /work/runs/s57/train-Bg/drafter /work/runs/s57/eval_Bg_nocopy.json 1 --copy-ngram 0 > /work/runs/s57/eval_Bg_nocopy.log 2>&1
date; echo DONE
