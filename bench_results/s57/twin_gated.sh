#!/bin/bash
# session 57: the gated Markov head on session 54's twin recipe (same data, init, seed, lr, minutes, one thread)
set -euo pipefail
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=/work/runs
DATA=$R/s50/data-m50,$R/s50/data-m51,$R/s51/data-wp510-t0,$R/s51/data-wp510-t0.7,$R/s53/data-lt53,$R/s53/data-m53
MIN=${MIN:-128}
date; echo TRAIN START
.venv/bin/hf-dspark train --data $DATA --eval-sequences 8 --layers 2 --draft-vocab-size 16384 --ce-weight 1.0 --ce-label target \
  --batch-size 4 --num-anchors 128 --lr 1e-3 --warmup-ratio 0.03 --max-steps 100000 --schedule-minutes $MIN \
  --time-budget-min $((MIN + 3)) --eval-every 400 --seed 54 --no-progress --markov-head-type gated --out $R/s57/twin-gated
date; echo TRAIN DONE
.venv/bin/hf-dspark eval-tau --drafter $R/s57/twin-gated/drafter --sets gsm8k,humaneval,mtbench \
    --num-prompts 40 --max-new-tokens 128 --out $R/s57/eval_twin_gated.json > $R/s57/eval-gated.log 2>&1
date; echo DONE
