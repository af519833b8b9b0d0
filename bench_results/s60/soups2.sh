#!/bin/bash
# trajectory averages: session 59's runs and their session 60 continuations (two points per trajectory), alone and
# with the shipped S7; chain evals side by side
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=/work/runs/s60; P=/work/runs/s59; S7=model_cards/dspark-smollm2-135m-instruct; H=.venv/bin/hf-dspark
EV="--sets gsm8k,humaneval,mtbench --num-prompts 40 --max-new-tokens 128"
.venv/bin/python scripts/soup_drafters.py $P/train-A/drafter $P/train-B/drafter $R/train-A/drafter $R/train-B/drafter $R/soup-traj > $R/soup2.log 2>&1
.venv/bin/python scripts/soup_drafters.py --weights 4,1,1,1,1 $S7 $P/train-A/drafter $P/train-B/drafter $R/train-A/drafter $R/train-B/drafter $R/soup-S7traj >> $R/soup2.log 2>&1
$H eval-tau --drafter $R/soup-traj $EV --copy-ngram 0 --out $R/eval_traj.json > $R/eval_traj.log 2>&1 &
$H eval-tau --drafter $R/soup-S7traj $EV --copy-ngram 0 --out $R/eval_S7traj.json > $R/eval_S7traj.log 2>&1 &
wait; date; echo CHAIN2 DONE
