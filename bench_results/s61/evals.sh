#!/bin/bash
# after train.sh: both arms' exported moving averages, chain of the drafter alone (the trees of 15 this script also started were stopped: both chains fell below S7)
cd /work/main
until grep -q "TRAIN DONE" /work/runs/s61/train.out; do sleep 20; done
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=/work/runs/s61; H=.venv/bin/hf-dspark; EV="--sets gsm8k,humaneval,mtbench --num-prompts 40 --max-new-tokens 128"
for a in V C; do $H eval-tau --drafter $R/train-$a/drafter $EV --copy-ngram 0 --out $R/eval_$a.json > $R/eval_$a.log 2>&1 & done
wait; date; echo CHAIN DONE
for a in V C; do .venv/bin/python scripts/compare_tau.py bench_results/s59/eval_S6AB.json $R/eval_$a.json > $R/cmp_$a.txt 2>&1; done
