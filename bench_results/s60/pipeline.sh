#!/bin/bash
# session 60: fresh self-distilled data (states kept), session 59's two runs continued side by side (their
# trajectories chained, not restarted from the shipped soup), soups, chain and tree-15 evals
set -uo pipefail
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=/work/runs/s60; P=/work/runs/s59; S7=model_cards/dspark-smollm2-135m-instruct; H=.venv/bin/hf-dspark
date; echo PROMPTS
.venv/bin/python scripts/make_domain_prompts.py --out $R/prompts-mix.jsonl --math 300 --code 0 --stories 500 --tasks 400 \
  --chat 1000 --seed 60 --exclude $P/prompts-mix.jsonl > $R/prompts.log 2>&1
GEN="--batch-size 64 --prompts-per-shard 64 --max-new-tokens 256 --max-prompt-tokens 256 --cache-hidden --drafter $S7"
date; echo DATA START
timeout 25m $H make-data --prompts $R/prompts-mix.jsonl --out $R/data-mix $GEN > $R/data-mix.log 2>&1 &
timeout 25m $H make-data --prompts sharegpt --out $R/data-sd07 --temperature 0.7 --top-p 1.0 --seed 60 --max-prompts 3000 $GEN > $R/data-sd07.log 2>&1 &
wait
date; echo DATA DONE
COMMON="--ce-weight 1.0 --ce-label target --batch-size 4 --num-anchors 128 --warmup-ratio 0.03 \
  --max-steps 100000 --schedule-minutes 64 --time-budget-min 67 --eval-every 200 --eval-sequences 8 --no-progress"
$H train --init $P/train-A/drafter --data $R/data-sd07,$R/data-mix:2 $COMMON --lr 1e-4 --seed 61 --out $R/train-A > $R/train-A.log 2>&1 &
$H train --init $P/train-B/drafter --data $R/data-mix,$R/data-sd07:2 $COMMON --lr 2e-4 --seed 62 --out $R/train-B > $R/train-B.log 2>&1 &
wait
date; echo TRAIN DONE
.venv/bin/python scripts/soup_drafters.py $R/train-A/drafter $R/train-B/drafter $R/soup-AB > $R/soup.log 2>&1
.venv/bin/python scripts/soup_drafters.py --weights 2,1,1 $S7 $R/train-A/drafter $R/train-B/drafter $R/soup-S7AB >> $R/soup.log 2>&1
EV="--sets gsm8k,humaneval,mtbench --num-prompts 40 --max-new-tokens 128"
$H eval-tau --drafter $R/soup-AB $EV --copy-ngram 0 --out $R/eval_AB.json > $R/eval_AB.log 2>&1 &
$H eval-tau --drafter $R/soup-S7AB $EV --copy-ngram 0 --out $R/eval_S7AB.json > $R/eval_S7AB.log 2>&1 &
wait
date; echo CHAIN DONE
$H eval-tau --drafter $R/soup-AB $EV --draft-tree-size 15 --out $R/tree_AB.json > $R/tree_AB.log 2>&1 &
$H eval-tau --drafter $R/soup-S7AB $EV --draft-tree-size 15 --out $R/tree_S7AB.json > $R/tree_S7AB.log 2>&1 &
wait
date; echo DONE
